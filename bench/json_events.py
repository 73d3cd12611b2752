"""Realistic JSON events, the kind of log a stream of this server carries.

    from bench.json_events import events
    lines = events(100_000)          # list of bytes, deterministic per seed

A mix like a service's log shipping: HTTP access logs (70%), application
log lines from a few dozen message templates (20%, some with an error and
a stack frame), and metric samples (10%). Fields vary the way real ones do:
timestamps that advance by milliseconds, ids drawn from skewed populations
(a few hot users and paths, a long tail), hex trace ids that never repeat,
latencies with a long tail. Compressors find the repeated keys and values,
not a pattern planted for them: zlib gains 3-5x on these, as on real logs.
"""

from __future__ import annotations

import json
import random

SERVICES = ["checkout", "catalog", "auth", "search", "payments", "gateway", "inventory"]
REGIONS = ["eu-west-1", "eu-central-1", "us-east-1", "us-west-2", "ap-south-1"]
METHODS = ["GET"] * 12 + ["POST"] * 4 + ["PUT", "DELETE", "PATCH"]
ROUTES = [
    "/api/v1/items/{id}",
    "/api/v1/items",
    "/api/v1/users/{id}",
    "/api/v1/users/{id}/orders",
    "/api/v2/orders/{id}",
    "/api/v2/orders",
    "/api/v2/cart/{id}/lines",
    "/search",
    "/login",
    "/health",
    "/static/js/app.{id}.js",
]
STATUSES = [200] * 40 + [201] * 4 + [204] * 3 + [301, 304, 304, 400, 401, 403] + [404] * 3 + [500]
AGENTS = [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/124.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4) AppleWebKit/605.1.15 (KHTML, like Gecko) "
    "Version/17.4 Safari/605.1.15",
    "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0",
    "okhttp/4.12.0",
    "python-requests/2.31.0",
    "curl/8.5.0",
    "Go-http-client/2.0",
]
TEMPLATES = [
    ("info", "user {user} logged in from {ip}"),
    ("info", "order {order} created with {n} lines, total {amount} EUR"),
    ("info", "cache refresh took {ms} ms ({n} keys)"),
    ("info", "payment {order} authorized by provider {provider}"),
    ("debug", "query plan for search '{term}' used index {index}"),
    ("warn", "slow query on {table}: {ms} ms"),
    ("warn", "retrying request to {service} (attempt {n} of 5)"),
    ("warn", "rate limit reached for client {client}"),
    ("error", "payment {order} failed: {reason}"),
    ("error", "unhandled exception in {service} handler"),
]
REASONS = ["card declined", "timeout talking to provider", "insufficient funds", "3DS failed"]
TERMS = ["shoes", "red dress", "laptop 16gb", "usb-c cable", "garden chair", "coffee"]
EXCEPTIONS = ["KeyError", "TimeoutError", "ConnectionResetError", "ValueError"]
METRICS = ["cpu.load", "mem.used_bytes", "http.requests", "queue.depth", "disk.io_wait"]


def _skewed(rng: random.Random, population: int) -> int:
    """A few hot ids and a long tail, like users or items."""
    return int(population * rng.random() ** 3)


def _access(rng: random.Random, ts: int, service: str) -> dict:
    route = rng.choice(ROUTES).replace("{id}", str(_skewed(rng, 200_000)))
    status = rng.choice(STATUSES)
    return {
        "ts": ts,
        "type": "access",
        "service": service,
        "region": rng.choice(REGIONS),
        "method": rng.choice(METHODS),
        "path": route,
        "status": status,
        "latency_ms": round(rng.lognormvariate(3.0, 0.9), 2),
        "bytes": 0 if status in (204, 304) else int(rng.lognormvariate(7.5, 1.2)),
        "user": f"u{_skewed(rng, 50_000):06d}",
        "ip": f"{rng.randrange(1, 224)}.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}",
        "agent": rng.choice(AGENTS),
        "trace_id": f"{rng.getrandbits(128):032x}",
    }


def _app(rng: random.Random, ts: int, service: str) -> dict:
    level, template = rng.choice(TEMPLATES)
    message = template.format(
        user=f"u{_skewed(rng, 50_000):06d}",
        ip=f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}",
        order=f"ord-{rng.getrandbits(40):010x}",
        n=rng.randrange(1, 20),
        amount=f"{rng.lognormvariate(3.5, 1.0):.2f}",
        ms=int(rng.lognormvariate(4.0, 1.0)),
        provider=rng.choice(["adyen", "stripe", "paypal"]),
        term=rng.choice(TERMS),
        index=rng.choice(["idx_title", "idx_title_price", "seq_scan"]),
        table=rng.choice(["orders", "order_lines", "users", "items"]),
        service=rng.choice(SERVICES),
        client=f"c-{rng.randrange(500)}",
        reason=rng.choice(REASONS),
    )
    event = {
        "ts": ts,
        "type": "log",
        "service": service,
        "level": level,
        "logger": f"{service}.{rng.choice(['api', 'db', 'worker', 'client'])}",
        "message": message,
        "trace_id": f"{rng.getrandbits(128):032x}",
    }
    if level == "error" and rng.random() < 0.5:
        event["error"] = {
            "type": rng.choice(EXCEPTIONS),
            "frame": f"{service}/handlers.py:{rng.randrange(20, 900)}",
        }
    return event


def _metric(rng: random.Random, ts: int, service: str) -> dict:
    name = rng.choice(METRICS)
    return {
        "ts": ts,
        "type": "metric",
        "name": name,
        "value": round(rng.lognormvariate(2.0, 1.5), 3),
        "tags": {
            "service": service,
            "host": f"{service}-{rng.randrange(12)}",
            "region": rng.choice(REGIONS),
        },
    }


def events(n: int, seed: int = 7, start_ms: int = 1_763_700_000_000) -> list[bytes]:
    """n JSON events (compact, one per message), timestamps increasing."""
    rng = random.Random(seed)
    ts = start_ms
    out = []
    for _ in range(n):
        ts += int(rng.expovariate(1 / 3))
        service = rng.choice(SERVICES)
        kind = rng.random()
        make = _access if kind < 0.7 else _app if kind < 0.9 else _metric
        out.append(json.dumps(make(rng, ts, service), separators=(",", ":")).encode())
    return out
