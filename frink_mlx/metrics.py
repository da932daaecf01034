"""Prometheus metrics for one daemon: a private registry per app, no globals.

Why a registry per app: tests build many apps in one process, and a scrape of
one daemon must never show another's counters; so nothing here touches
`prometheus_client`'s default REGISTRY.

Two sources feed it:
1. Push, per request: the access middleware (http/access.py) calls
   `observe_request`, `observe_tokens`, `observe_ttft` and
   `observe_token_latency` from what the endpoint left on `request.state`
   (see that module), so adapters need no metrics wiring of their own.
   The hub calls `observe_model_load(model, generation, load_time_s)`.
2. Pull, per scrape: engine gauges (queue depth, running sequences, KV blocks,
   prefix-cache hits) are read lazily from `stats_fn() -> {model: EngineStats}`,
   bound with `bind_stats`: one sample per resident model, labelled `model`
   (several models are resident at once, serving/residency.py). No model loaded
   exports nothing rather than zeros: absent means "not measured". The SSD
   tier of the prefix cache (engine/kv/disk.py, one per daemon) is read from
   `disk_fn() -> DiskStats | None` the same way, unlabelled.

Label cardinality is bounded: `route` is the matched route template (unknown
paths are "<unmatched>"), `method` one of KNOWN_METHODS (anything else is
"other": requests are counted before the Host and key checks, so a client
sending made-up methods must not grow the series), `model` is a registry name,
`status` an HTTP code.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .engine.kv.disk import DiskStats
from .engine.types import EngineStats

log = logging.getLogger(__name__)

StatsFn = Callable[[], "Mapping[str, EngineStats]"]  # resident model name -> its engine
DiskFn = Callable[[], "DiskStats | None"]

# Seconds. CPU-backend TTFTs run from milliseconds (tiny models) to tens of seconds.
TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})
REQUEST_BUCKETS_S = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Metrics:
    """Every metric the daemon exports, on its own `CollectorRegistry`."""

    def __init__(self, stats_fn: StatsFn | None = None, disk_fn: DiskFn | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "frink_requests", "HTTP requests by route, method and status.",
            ["route", "method", "status"], registry=r)
        self.request_duration = Histogram(
            "frink_request_duration_seconds", "Whole-request wall time, streams included.",
            ["route"], buckets=REQUEST_BUCKETS_S, registry=r)
        self.rejections = Counter(
            "frink_requests_rejected", "Requests refused at the edge, by reason "
            "(host, origin, auth, size, overloaded).", ["reason"], registry=r)
        self.in_flight = Gauge(
            "frink_http_requests_in_flight", "Requests admitted and not yet finished.",
            registry=r)
        self.prompt_tokens = Counter(
            "frink_prompt_tokens", "Prompt tokens processed.", ["model"], registry=r)
        self.generation_tokens = Counter(
            "frink_generation_tokens", "Tokens generated.", ["model"], registry=r)
        self.ttft = Histogram(
            "frink_time_to_first_token_seconds", "Time from request arrival to the first token.",
            ["model"], buckets=TTFT_BUCKETS_S, registry=r)
        self.token_latency = Histogram(
            "frink_time_per_output_token_seconds",
            "Mean time between generated tokens, one observation per request.",
            ["model"], buckets=TOKEN_LATENCY_BUCKETS_S, registry=r)
        self.model_generation = Gauge(
            "frink_model_generation", "Generation number of the most recently loaded model.",
            registry=r)
        self.model_load_time = Gauge(
            "frink_model_load_seconds", "Wall time of the model's last load.", ["model"],
            registry=r)
        self.model_loads = Counter(
            "frink_model_loads", "Model loads (initial, swaps and reloads).", ["model"],
            registry=r)
        self._stats_fn: StatsFn | None = stats_fn
        self._disk_fn = disk_fn
        r.register(_EngineCollector(self))
        r.register(_DiskCollector(self))

    # --- push side -------------------------------------------------------
    def bind_stats(self, stats_fn: StatsFn | None) -> None:
        """Set (or clear) the callable scraped for engine gauges."""
        self._stats_fn = stats_fn

    def observe_request(self, route: str, status: int, duration_s: float,
                        method: str = "GET") -> None:
        method = method if method in KNOWN_METHODS else "other"
        self.requests.labels(route=route, method=method, status=str(status)).inc()
        self.request_duration.labels(route=route).observe(max(duration_s, 0.0))

    def observe_rejection(self, reason: str) -> None:
        self.rejections.labels(reason=reason).inc()

    def observe_tokens(self, prompt: int, completion: int, model: str = "") -> None:
        if prompt > 0:
            self.prompt_tokens.labels(model=model).inc(prompt)
        if completion > 0:
            self.generation_tokens.labels(model=model).inc(completion)

    def observe_ttft(self, seconds: float, model: str = "") -> None:
        self.ttft.labels(model=model).observe(max(seconds, 0.0))

    def observe_token_latency(self, seconds: float, model: str = "") -> None:
        self.token_latency.labels(model=model).observe(max(seconds, 0.0))

    def observe_model_load(self, model: str, generation: int, load_time_s: float) -> None:
        self.model_generation.set(generation)
        self.model_load_time.labels(model=model).set(load_time_s)
        self.model_loads.labels(model=model).inc()

    # --- pull side -------------------------------------------------------
    def engine_stats(self) -> Mapping[str, EngineStats]:
        """Each resident model's engine stats; empty when none can be read."""
        if self._stats_fn is None:
            return {}
        try:
            return self._stats_fn()
        except Exception:  # a scrape must never fail because the engine is mid-swap
            log.debug("engine stats unavailable during scrape", exc_info=True)
            return {}

    def disk_stats(self) -> DiskStats | None:
        if self._disk_fn is None:
            return None
        try:
            return self._disk_fn()
        except Exception:  # a scrape must never fail
            log.debug("disk tier stats unavailable during scrape", exc_info=True)
            return None

    def render(self) -> bytes:
        """The registry in Prometheus text exposition format."""
        return generate_latest(self.registry)


class _EngineCollector:
    """Reads EngineStats at scrape time; nothing is cached between scrapes."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # families appear only once an engine exists

    def collect(self) -> Iterator[Metric]:
        by_model = self._metrics.engine_stats()
        if not by_model:
            return
        for kind, families in ((GaugeMetricFamily, _GAUGES), (CounterMetricFamily, _COUNTERS)):
            for name, doc, read in families:
                family = kind(name, doc, labels=["model"])
                for model, stats in by_model.items():
                    value = read(stats)
                    if value is not None:
                        family.add_metric([model], float(value))
                if family.samples:
                    yield family


class _DiskCollector:
    """The SSD tier's gauges and counters, read at scrape time (module source 2)."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        stats = self._metrics.disk_stats()
        if stats is None:
            return
        for kind, families in ((GaugeMetricFamily, _DISK_GAUGES), (CounterMetricFamily, _DISK_COUNTERS)):
            for name, doc, field in families:
                yield kind(name, doc, value=float(getattr(stats, field)))


_DISK_GAUGES = [
    ("frink_kv_disk_enabled", "1 while the prefix cache's SSD tier is on, 0 once it turned off.",
     "enabled"),
    ("frink_kv_disk_bytes", "Bytes of KV block files in the SSD tier.", "used_bytes"),
    ("frink_kv_disk_budget_bytes", "The SSD tier's byte budget.", "budget_bytes"),
    ("frink_kv_disk_files", "KV block files in the SSD tier.", "num_files"),
    ("frink_kv_disk_queued_bytes", "Snapshots waiting for the SSD tier's writer.", "queued_bytes"),
]
_DISK_COUNTERS = [
    ("frink_kv_disk_reads", "Prompts that read a run of blocks back from the SSD tier.",
     "read_requests_total"),
    ("frink_kv_disk_hit_blocks", "KV blocks read back from the SSD tier and verified.",
     "hit_blocks_total"),
    ("frink_kv_disk_written_blocks", "KV blocks written to the SSD tier.", "written_blocks_total"),
    ("frink_kv_disk_dropped_blocks", "KV block snapshots the SSD tier's queue had no room for.",
     "dropped_blocks_total"),
    ("frink_kv_disk_refused_files", "Torn, corrupt, foreign or outdated block files deleted.",
     "refused_files_total"),
    ("frink_kv_disk_evicted_files", "Block files deleted to keep the SSD tier in its budget.",
     "evicted_files_total"),
]


def _extra(key: str) -> Callable[[EngineStats], float | None]:
    return lambda s: s.extra.get(key)


# (name, help, how to read it from EngineStats); None = this engine does not report it
_GAUGES: list[tuple[str, str, Callable[[EngineStats], float | None]]] = [
    ("frink_queue_depth", "Sequences waiting for admission.", lambda s: s.num_waiting),
    ("frink_running_sequences", "Sequences in the running batch.", lambda s: s.num_running),
    ("frink_kv_blocks_capacity", "KV cache blocks in the pool.", lambda s: s.num_blocks_total),
    ("frink_kv_blocks_used", "KV cache blocks referenced by sequences.",
     lambda s: s.num_blocks_used),
    ("frink_kv_blocks_cached", "Free KV blocks still holding a prefix hash.",
     lambda s: s.num_blocks_cached),
    ("frink_kv_block_size_tokens", "Tokens per KV block.", lambda s: s.block_size),
    ("frink_context_ceiling_tokens", "Longest sequence the KV budget admits.",
     lambda s: s.context_ceiling),
]
_COUNTERS: list[tuple[str, str, Callable[[EngineStats], float | None]]] = [
    ("frink_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache.",
     lambda s: s.prefix_hit_tokens_total),
    ("frink_prefix_cache_disk_hit_tokens", "Of those, tokens read back from the SSD tier.",
     _extra("disk_hit_tokens_total")),
    ("frink_engine_steps", "Engine steps run by the model's current generation.",
     lambda s: s.steps_total),
    ("frink_spec_draft_tokens", "Speculative tokens drafted (prompt lookup and draft model).",
     lambda s: s.draft_tokens_total),
    ("frink_spec_draft_accepted_tokens", "Speculative tokens accepted by verification.",
     lambda s: s.draft_accepted_tokens_total),
    ("frink_spec_draft_model_tokens", "Speculative tokens the draft model drafted.",
     _extra("draft_model_tokens_total")),
    ("frink_spec_draft_model_accepted_tokens", "Draft-model tokens accepted by verification.",
     _extra("draft_model_accepted_total")),
    ("frink_sliced_prefill_turns", "Gate turns a prefill gave back between layers to another "
     "resident model's engine (engine/turns.py).", _extra("sliced_prefill_turns_total")),
]


def metrics_of(app: Any) -> Metrics | None:
    """The app's Metrics (`app.state.metrics`, set by the lifespan), or None before start-up."""
    metrics = getattr(getattr(app, "state", None), "metrics", None)
    return metrics if isinstance(metrics, Metrics) else None


async def metrics_endpoint(request: Request) -> Response:
    metrics = metrics_of(request.app)
    if metrics is None:
        return Response("# metrics unavailable: daemon is starting\n", status_code=503,
                        media_type="text/plain", headers={"Retry-After": "1"})
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)


routes: list[BaseRoute] = [Route("/metrics", metrics_endpoint, methods=["GET"])]
