// AgentGrad dashboard: live refresh of the rollouts table, hover values on charts, replay keys.
// No dependencies, no inline script.
"use strict";

(function () {
  const toggle = document.getElementById("live-refresh");
  const target = document.getElementById("rollout-table");
  if (!toggle || !target) return;

  const key = "agentgrad.liveRefresh";
  const interval = Number(toggle.dataset.interval) || 3000;
  let timer = null;

  async function refresh() {
    try {
      const response = await fetch(toggle.dataset.url, { credentials: "same-origin", cache: "no-store" });
      if (!response.ok) throw new Error("HTTP " + response.status);
      // The server renders the fragment with autoescaping; it is our own markup.
      target.innerHTML = await response.text();
      target.dataset.refreshedAt = String(Date.now());
      toggle.parentElement.title = "";
    } catch (error) {
      toggle.parentElement.title = "refresh failed: " + error.message;
    }
  }

  function apply() {
    window.clearInterval(timer);
    timer = toggle.checked ? window.setInterval(refresh, interval) : null;
    try { window.localStorage.setItem(key, toggle.checked ? "1" : "0"); } catch (_) { /* private mode */ }
  }

  try { toggle.checked = window.localStorage.getItem(key) === "1"; } catch (_) { /* private mode */ }
  toggle.addEventListener("change", apply);
  apply();
})();

// Charts: moving over a plot shows every run's value at the nearest step (the server drew the
// points; each carries data-run, data-step and data-value).
(function () {
  document.querySelectorAll("figure.chart").forEach(function (figure) {
    const svg = figure.querySelector("svg.plot");
    const readout = figure.querySelector(".hover-readout");
    const cursor = svg && svg.querySelector("line.cursor");
    if (!svg || !readout || !cursor) return;
    const points = Array.from(svg.querySelectorAll("circle.pt"));
    if (!points.length) return;

    function show(event) {
      const box = svg.getBoundingClientRect();
      const scale = svg.viewBox.baseVal.width / box.width;
      const x = (event.clientX - box.left) * scale;
      let nearest = points[0];
      points.forEach(function (p) {
        if (Math.abs(p.cx.baseVal.value - x) < Math.abs(nearest.cx.baseVal.value - x)) nearest = p;
      });
      const step = nearest.dataset.step;
      const parts = [];
      points.forEach(function (p) {
        const on = p.dataset.step === step;
        p.classList.toggle("on", on);
        if (on) parts.push(p.dataset.run + " " + p.dataset.value);
      });
      cursor.setAttribute("x1", nearest.cx.baseVal.value);
      cursor.setAttribute("x2", nearest.cx.baseVal.value);
      cursor.setAttribute("visibility", "visible");
      readout.textContent = "step " + step + ": " + parts.join(" · ");
    }

    function hide() {
      points.forEach(function (p) { p.classList.remove("on"); });
      cursor.setAttribute("visibility", "hidden");
      readout.textContent = "";
    }

    svg.addEventListener("mousemove", show);
    svg.addEventListener("mouseleave", hide);
  });
})();

// Replay: the arrow keys follow the previous/next links.
(function () {
  const nav = document.querySelector(".replay-nav");
  if (!nav) return;
  document.addEventListener("keydown", function (event) {
    if (event.target.closest("input, select, textarea")) return;
    const rel = { ArrowLeft: "prev", ArrowRight: "next" }[event.key];
    const link = rel && nav.querySelector("a[rel=" + rel + "]");
    if (link) window.location.href = link.href;
  });
})();
