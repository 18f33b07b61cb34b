"""The dashboard's routes: server-rendered pages over any :class:`~agentgrad.store.protocol.Store`.

Pages are Jinja2 templates (autoescaped) with one vendored stylesheet and one small script for
live refresh; there is no frontend build and nothing is fetched from the network. Handlers are
plain ``def`` functions, so FastAPI runs the (synchronous) store calls in its thread pool.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping
from importlib import resources as package_files
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from agentgrad import semconv
from agentgrad.dashboard import charts as charts_view
from agentgrad.dashboard import credit as credit_view
from agentgrad.dashboard import prompts as prompts_view
from agentgrad.dashboard import runs as runs_view
from agentgrad.dashboard import tokens as tokens_view
from agentgrad.dashboard import views
from agentgrad.dashboard.auth import COOKIE_NAME, TokenGate, url_without_token
from agentgrad.dashboard.tokens import TokenDecoder
from agentgrad.errors import NotFoundError
from agentgrad.store.protocol import RolloutFilter, Store
from agentgrad.types import INT64_MAX, Rollout, RolloutStatus

#: Sent with every page: no inline script or style is needed, so none is allowed.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_STATIC_TYPES = {"dashboard.css": "text/css; charset=utf-8", "dashboard.js": "text/javascript; charset=utf-8"}
_SORT_KEYS = ("enqueue_time", "start_time", "end_time", "rollout_id", "status", "reward")
_PAGE_SIZES = (25, 50, 100, 200)
_STATUSES = tuple(s.value for s in RolloutStatus)
#: Spans shown per page of a rollout: a rollout may hold hundreds of thousands, and its page
#: must answer at once (the next ones are a link away).
SPAN_PAGE = 200
#: Reward spans listed on a rollout's page.
REWARDS_SHOWN = 100
#: Runs whose curves one page overlays.
RUNS_OVERLAID = 4
#: Rollouts a group page shows side by side.
GROUP_MAX = 64
#: Agent-scope spans read per rollout of the rollouts table (for its agent names).
AGENT_SPANS = 20
#: Rollouts read at a time when the rollouts table is filtered by run.
RUN_SCAN_CHUNK = 1000
#: Longest run or group name a filter takes.
MAX_NAME = 512


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("agentgrad.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        seconds=views.fmt_seconds,
        time=views.fmt_time,
        number=views.fmt_number,
        json=views.pretty_json,
        q=lambda value: quote(str(value), safe=""),
    )
    return env


def _static_files() -> dict[str, bytes]:
    folder = package_files.files("agentgrad.dashboard") / "static"
    return {name: (folder / name).read_bytes() for name in _STATIC_TYPES}


def _choice(value: Any, allowed: tuple[Any, ...], default: Any) -> Any:
    return value if value in allowed else default


def _name(value: str | None) -> str | None:
    """A run or group name from a request: trimmed, at most MAX_NAME characters; None when empty
    or holding a NUL (which no stored name can hold), so it filters nothing instead of failing."""
    value = (value or "").strip()[:MAX_NAME]
    return value if value and "\x00" not in value else None


def _positive_int(value: str | None, default: int, most: int = INT64_MAX) -> int:
    """A positive integer from a query parameter, at most ``most``; ``default`` when absent or not one."""
    try:
        number = int(value) if value is not None else default
    except ValueError:
        return default
    return min(number, most) if number > 0 else default


def create_router(
    store: Store,
    token: str | None = None,
    *,
    prefix: str = "/dashboard",
    alive_seconds: float = 60.0,
    refresh_seconds: float = 3.0,
    tokenizers: Mapping[str, str | Path] | None = None,
) -> APIRouter:
    """The dashboard as a router to include in any FastAPI app (the store service mounts it at ``/``).

    Args:
        store: where the data comes from; only read, never written.
        token: when set, pages need ``Authorization: Bearer <token>`` or a ``?token=`` login.
        prefix: the URL path the pages live under.
        alive_seconds: a runner whose last heartbeat is older than this is shown as silent.
        refresh_seconds: how often live refresh reloads the rollouts table.
        tokenizers: model name → tokenizer (``tokenizer.json`` or a model directory; ``"*"``: any
            model), to show completion tokens as text (see :class:`~.tokens.TokenDecoder`).
    """
    gate = TokenGate(token)
    decoder = TokenDecoder(tokenizers)
    static = _static_files()
    router = APIRouter(prefix=prefix, include_in_schema=False)
    env = _environment()

    def render(
        template: str, request: Request, *, status: int = 200, headers: dict[str, str] | None = None, **context: Any
    ) -> HTMLResponse:
        html = env.get_template(template).render(base=prefix, path=request.url.path, **context)
        return HTMLResponse(html, status_code=status, headers={**SECURITY_HEADERS, **(headers or {})})

    def page(handler: Callable[..., Response]) -> Callable[..., Response]:
        """Wrap a page handler in the token gate and turn unknown ids into a 404 page."""

        @functools.wraps(handler)
        def guarded(*args: Any, **kwargs: Any) -> Response:
            request: Request = kwargs["request"]
            login = gate.login_attempt(request)
            if login:
                response = RedirectResponse(url_without_token(request), status_code=303, headers=SECURITY_HEADERS)
                response.set_cookie(
                    COOKIE_NAME,
                    gate.session_value or "",
                    httponly=True,
                    samesite="lax",
                    secure=request.url.scheme == "https",
                    path=prefix or "/",
                )
                return response
            if login is False or not gate.allows(request):
                return render(
                    "unauthorized.html",
                    request,
                    status=401,
                    wrong=login is False,
                    headers={"WWW-Authenticate": "Bearer"},
                )
            try:
                return handler(*args, **kwargs)
            except NotFoundError as exc:
                return render("message.html", request, status=404, title="Not found", message=str(exc))

        return guarded

    @router.get("/static/{name}")
    def static_file(name: str) -> Response:
        """The vendored stylesheet and script (no data, so no token needed)."""
        if name not in static:
            return Response("not found", status_code=404, media_type="text/plain")
        return Response(
            static[name],
            media_type=_STATIC_TYPES[name],
            headers={"Cache-Control": "max-age=300", "X-Content-Type-Options": "nosniff"},
        )

    @router.get("/")
    def index(request: Request) -> Response:
        query = f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse(f"{prefix}/rollouts{query}", status_code=307)

    @router.get("/rollouts")
    @page
    def rollouts(request: Request) -> Response:
        """The rollouts table: filter by status, mode and missing LLM calls; sort; page."""
        params = request.query_params
        statuses = [s for s in params.getlist("status") if s in _STATUSES]
        mode = _choice(params.get("mode"), ("train", "val", "test"), None)
        no_llm = params.get("no_llm") == "1"
        sort = _choice(params.get("sort"), _SORT_KEYS, "enqueue_time")
        order = _choice(params.get("order"), ("asc", "desc"), "desc")
        per_page = _choice(_positive_int(params.get("per_page"), 50), _PAGE_SIZES, 50)
        page_number = _positive_int(params.get("page"), 1, most=INT64_MAX // per_page)
        group, run = _name(params.get("group")), _name(params.get("run"))
        query = RolloutFilter(
            status=[RolloutStatus(s) for s in statuses] or None,
            mode=mode,
            group_id=group,
            no_llm_calls=True if no_llm else None,
            sort_by=sort,
            descending=order == "desc",
            limit=per_page,
            offset=(page_number - 1) * per_page,
        )
        total: int | None
        if run is None:
            total, found = store.count_rollouts(query), store.query_rollouts(query)
        else:
            found, total = _page_of_run(query, run)
        # A run's scan that stopped early knows only that there is a next page.
        pages = max(1, math.ceil(total / per_page)) if total is not None else page_number + 1
        now = time.time()
        current = {
            "status": statuses,
            "mode": mode or "",
            "no_llm": "1" if no_llm else "",
            "sort": sort,
            "order": order,
            "per_page": per_page,
            "page": page_number,
            "group": group or "",
            "run": run or "",
        }

        def url(**changes: Any) -> str:
            merged = {**current, **changes}
            return f"{prefix}/rollouts?" + urlencode(
                {k: v for k, v in merged.items() if v not in ("", None, [])}, doseq=True
            )

        rows = [
            views.RolloutRow(
                r,
                views.rollout_duration(r, now),
                views.lacks_llm_calls(r),
                runs_view.task_summary(r.input),
                runs_view.run_of(r),
                runs_view.step_of(r),
                _agent_names(r),
            )
            for r in found
        ]
        context = dict(
            rows=rows, total=total, page=page_number, pages=pages, url=url, sort=sort, order=order, offset=query.offset
        )
        if params.get("partial") == "table":
            return render("_rollout_table.html", request, **context)
        counts = {s.value: store.count_rollouts(RolloutFilter(status=[s])) for s in RolloutStatus}
        no_llm_total = store.count_rollouts(RolloutFilter(no_llm_calls=True))
        run_ids = list(dict.fromkeys(r.run_id for r in store.query_metrics()))
        return render(
            "rollouts.html",
            request,
            statuses=_STATUSES,
            selected=statuses,
            mode=mode,
            no_llm=no_llm,
            per_page=per_page,
            page_sizes=_PAGE_SIZES,
            sort_keys=_SORT_KEYS,
            counts=counts,
            no_llm_total=no_llm_total,
            refresh_ms=int(refresh_seconds * 1000),
            table_url=url(partial="table"),
            group=group,
            run=run,
            run_ids=run_ids,
            **context,
        )

    def _page_of_run(query: RolloutFilter, run: str) -> tuple[list[Rollout], int | None]:
        """One page of a run's rollouts. No store filter names a run, so the rollouts matching the
        other filters are read in chunks, in the page's order, until the page and one more
        rollout are found: (the page, the total; None when the scan stopped before the end)."""
        matches: list[Rollout] = []
        read = 0
        end = query.offset + (query.limit or 0)
        while True:
            chunk = store.query_rollouts(query.model_copy(update={"limit": RUN_SCAN_CHUNK, "offset": read}))
            read += len(chunk)
            matches += [r for r in chunk if runs_view.run_of(r) == run]
            if len(chunk) < RUN_SCAN_CHUNK:
                return matches[query.offset : end], len(matches)
            if len(matches) > end:
                return matches[query.offset : end], None

    def _agent_names(rollout: Rollout) -> list[str]:
        """The agent names of a rollout's LLM calls, as the store keeps them; for a rollout without
        (stored before the store kept them, or no call captured), the agent scopes of its latest
        attempt (a few spans read by name)."""
        if rollout.agent_names:
            return rollout.agent_names
        if rollout.num_attempts == 0:
            return []
        spans = store.query_spans(rollout.rollout_id, "latest", name=semconv.SPAN_AGENT, limit=AGENT_SPANS)
        return list(
            dict.fromkeys(str(s.attributes[semconv.AGENT_NAME]) for s in spans if s.attributes.get(semconv.AGENT_NAME))
        )

    @router.get("/groups/{group_id:path}")
    @page
    def group_detail(request: Request, group_id: str) -> Response:
        """A group's rollouts side by side: reward, the credit its calls got, GRPO advantage."""
        name = _name(group_id)
        rollouts = store.query_rollouts(RolloutFilter(group_id=name, limit=GROUP_MAX + 1)) if name else []
        if not rollouts:
            raise NotFoundError("group", group_id)
        more = len(rollouts) > GROUP_MAX
        rule = credit_view.rule_name(request.query_params.get("credit"))
        view = credit_view.group_view(store, rollouts[:GROUP_MAX], rule)
        return render(
            "group.html",
            request,
            group_id=group_id,
            view=view,
            more=more,
            rules=credit_view.RULES,
            task=runs_view.task_summary,
            run=runs_view.run_of(rollouts[0]),
            step=runs_view.step_of(rollouts[0]),
        )

    @router.get("/rollouts/{rollout_id:path}")
    @page
    def rollout_detail(request: Request, rollout_id: str) -> Response:
        """One rollout: attempts on a timeline, rewards, and one page of the span tree with its
        LLM calls (``?after=`` a sequence id: the page after it; SPAN_PAGE spans a page)."""
        rollout = store.get_rollout(rollout_id)
        attempts = store.get_attempts(rollout_id)
        now = time.time()
        wanted = request.query_params.get("attempt")
        attempt = next((a for a in attempts if a.attempt_id == wanted), attempts[-1] if attempts else None)
        if wanted and (attempt is None or attempt.attempt_id != wanted):
            raise NotFoundError("attempt", wanted, f" of rollout {rollout_id!r}")
        after = _positive_int(request.query_params.get("after"), 0)
        spans, rewards, next_after = [], [], None
        if attempt is not None:
            spans = store.query_spans(rollout_id, attempt.attempt_id, after_sequence_id=after, limit=SPAN_PAGE + 1)
            if len(spans) > SPAN_PAGE:
                del spans[SPAN_PAGE:]
                next_after = spans[-1].sequence_id
            rewards = store.query_spans(rollout_id, attempt.attempt_id, name=semconv.SPAN_REWARD, limit=REWARDS_SHOWN)
        rows = views.span_rows(spans, now)
        rule = credit_view.rule_name(request.query_params.get("credit"))
        credit = (
            credit_view.attempt_credit(store, rollout, attempt.attempt_id, rule, latest=attempt is attempts[-1])
            if attempt
            else None
        )
        return render(
            "rollout.html",
            request,
            rollout=rollout,
            duration=views.rollout_duration(rollout, now),
            no_llm=views.lacks_llm_calls(rollout),
            attempts=views.attempt_rows(attempts, now),
            attempt=attempt,
            spans=rows,
            calls=views.llm_calls(rows, decoder),
            rewards=views.reward_rows(rewards),
            after=after,
            next_after=next_after,
            span_page=SPAN_PAGE,
            credit=credit,
            rules=credit_view.RULES,
            legend=tokens_view.legend(),
            run=runs_view.run_of(rollout),
            step=runs_view.step_of(rollout),
        )

    @router.get("/replay/{rollout_id:path}")
    @page
    def replay(request: Request, rollout_id: str) -> Response:
        """A rollout's trajectory one LLM call at a time (``?call=`` 1…n, ``?attempt=``): what was
        new in the call's request, its answer and tokens, the credit it got, the rewards after it."""
        rollout = store.get_rollout(rollout_id)
        attempts = store.get_attempts(rollout_id)
        wanted = request.query_params.get("attempt")
        attempt = (
            next((a for a in attempts if a.attempt_id == wanted), None)
            if wanted
            else (attempts[-1] if attempts else None)
        )
        if attempt is None:
            raise NotFoundError("attempt", wanted or "(none yet)", f" of rollout {rollout_id!r}")
        rule = credit_view.rule_name(request.query_params.get("credit"))
        steps = views.replay_steps(store, rollout_id, attempt.attempt_id, credit_view.CALLS_MAX)
        number = min(_positive_int(request.query_params.get("call"), 1), max(1, len(steps.calls)))
        step = views.replay_step(steps, number, decoder, time.time()) if steps.calls else None
        credit = credit_view.attempt_credit(store, rollout, attempt.attempt_id, rule, latest=attempt is attempts[-1])
        return render(
            "replay.html",
            request,
            rollout=rollout,
            attempt=attempt,
            steps=steps,
            number=number,
            step=step,
            credit=credit,
            rules=credit_view.RULES,
            rule=rule,
            legend=tokens_view.legend(),
        )

    @router.get("/runs")
    @router.get("/training")  # the page's old name, still served for old links
    @page
    def runs(request: Request) -> Response:
        """Every run (from the metric records), and the curves of up to RUNS_OVERLAID of them
        overlaid (``?run=`` repeated; default: the newest run); ``?all=1`` plots every metric."""
        records = store.query_metrics()
        summaries = runs_view.summarize_runs(store, records)
        known = [r.run_id for r in summaries]
        chosen = [r for r in dict.fromkeys(request.query_params.getlist("run")) if r in known][:RUNS_OVERLAID]
        chosen = chosen or known[:1]
        curves = runs_view.curves(records, chosen)
        key, rest = runs_view.metric_order(curves)
        show_all = request.query_params.get("all") == "1"
        names = key + rest if show_all or not key else key
        charts_shown = [charts_view.line_chart(name, curves[name]) for name in names]
        colors = dict(zip(chosen, charts_view.PALETTE, strict=False))  # at most RUNS_OVERLAID runs
        query = urlencode([("run", r) for r in chosen])
        return render(
            "runs.html",
            request,
            summaries=summaries,
            chosen=chosen,
            charts=charts_shown,
            colors=colors,
            hidden=0 if show_all else len(rest),
            show_all=show_all,
            query=query,
            most=RUNS_OVERLAID,
        )

    @router.get("/prompts")
    @page
    def prompts(request: Request) -> Response:
        """APO runs' candidate prompts per round with their scores, and a diff of two of them
        (``?a=&b=`` snapshot ids; default: the seed against the best)."""
        apo = prompts_view.apo_runs(store.query_resources())
        params = request.query_params
        run = _choice(params.get("run"), tuple(apo), next(iter(apo), None))
        rounds: list[prompts_view.Round] = []
        best = old = new = None
        diff: list[views.ItemDiff] = []
        if run is not None:
            rounds, best = prompts_view.rounds(store, run, apo[run])
            every = {c.resources_id: c for r in rounds for c in r.candidates}
            seed = rounds[0].candidates[0] if rounds and rounds[0].candidates else None
            old = every.get(params.get("a") or "") or seed
            new = every.get(params.get("b") or "") or best or seed
            if old is not None and new is not None:
                diff = views.diff_items({apo[run]: old.template}, {apo[run]: new.template})
        return render(
            "prompts.html",
            request,
            runs=list(apo),
            run=run,
            rounds=rounds,
            best=best,
            diff=diff,
            old=old,
            new=new,
            prompt_name=apo.get(run or ""),
            val_group=prompts_view.val_group,
        )

    @router.get("/resources")
    @page
    def resources(request: Request) -> Response:
        """Resource versions, and a diff between two of them (``?a=&b=``; default: the last two)."""
        snapshots = store.query_resources()
        by_id = {s.resources_id: s for s in snapshots}
        params = request.query_params
        new = by_id.get(params.get("b") or "") or (snapshots[-1] if snapshots else None)
        older = [s for s in snapshots if new is not None and s.version < new.version]
        old = by_id.get(params.get("a") or "") or (older[-1] if older else None)
        diffs = views.diff_items(old.items, new.items) if old is not None and new is not None else []
        return render(
            "resources.html",
            request,
            snapshots=list(reversed(snapshots)),
            old=old,
            new=new,
            diffs=diffs,
            kind=views.resource_kind,
            text=views.resource_text,
        )

    @router.get("/runners")
    @page
    def runners(request: Request) -> Response:
        """Runners: alive or silent, what each runs, when each was last heard from."""
        now = time.time()

        def state(worker: Any) -> str:
            if worker.status == "stopped":
                return "stopped"
            return "alive" if now - worker.last_heartbeat_time <= alive_seconds else "silent"

        workers = [(w, state(w), now - w.last_heartbeat_time) for w in store.query_workers()]
        order = {"alive": 0, "silent": 1, "stopped": 2}
        workers.sort(key=lambda item: (order[item[1]], item[0].worker_id))
        return render(
            "runners.html",
            request,
            workers=workers,
            alive_seconds=alive_seconds,
            alive=sum(1 for _, s, _ in workers if s == "alive"),
        )

    return router
