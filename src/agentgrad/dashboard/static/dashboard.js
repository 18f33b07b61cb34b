// AgentGrad dashboard: live refresh of the rollouts table. No dependencies, no inline script.
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
