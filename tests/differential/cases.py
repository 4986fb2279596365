"""Seeded sample streams for the differential test against TensorFusion's own Go recommender.

``cases()`` is deterministic: the same list on every machine. Each case is one workload (QoS, original
resources, an ``autoSetResources`` block, a history period) and a list of ticks, each tick a batch of
worker samples followed by one recommendation. ``python -m tests.differential.cases`` prints them as the
JSON that ``tfrecommend`` (main.go beside this file) reads.

Two families:

- **exact**: each worker's first VRAM sample in a 24-hour window is that window's peak, so TensorFusion's
  peak-replacement arithmetic never runs; our recommender must agree with TensorFusion on every tick.
- ``vram_peak_replaced_*``: VRAM rises inside a window, the case of TensorFusion's bug (the replaced peak
  is subtracted with the wrong weight). Ours must agree with TensorFusion only in its compatibility mode.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

BASE_UNIX_S = 1_790_000_000  # 2026-09-21, a fixed start
GI = 2**30
HOUR_NS = 3600 * 10**9


def _resources(rng: random.Random) -> dict[str, str]:
    req_t = rng.choice([2, 5, 8, 10, 20, 40, 60, 100])
    lim_t = req_t * rng.choice([1, 1, 2])
    req_v = rng.choice([2, 4, 8, 12, 16, 24, 40])
    lim_v = req_v * rng.choice([1, 1, 2])
    return {"requests.tflops": str(req_t), "limits.tflops": str(lim_t),
            "requests.vram": f"{req_v}Gi", "limits.vram": f"{lim_v}Gi"}


def _auto_set(rng: random.Random) -> dict[str, Any]:
    asr: dict[str, Any] = {"enable": True, "targetResource": rng.choice(["all", "compute", "vram"])}
    if rng.random() < 0.5:
        asr["targetComputePercentile"] = str(rng.choice([0.9, 0.95, 0.8]))
        asr["lowerBoundComputePercentile"] = str(rng.choice([0.5, 0.3, 0.6]))
        asr["upperBoundComputePercentile"] = str(rng.choice([0.99, 0.97]))
    if rng.random() < 0.5:
        asr["targetVRAMPercentile"] = str(rng.choice([0.9, 0.98]))
        asr["lowerBoundVRAMPercentile"] = str(rng.choice([0.5, 0.4]))
        asr["upperBoundVRAMPercentile"] = str(rng.choice([0.99, 0.95]))
    if rng.random() < 0.3:
        asr["marginFraction"] = str(rng.choice([0.1, 0.2, 0.05]))
    if rng.random() < 0.3:
        asr["updateThreshold"] = str(rng.choice([0.05, 0.2, 0.0]))
    if rng.random() < 0.2:
        asr["minComputeResourcesRatio"] = "0.5"
        asr["maxVRAMResourcesRatio"] = "2"
    return asr


def _stream(rng: random.Random, workers: int, ticks: int, spacing_s: int, start_s: int,
            rising_vram: bool) -> list[dict[str, Any]]:
    levels = [rng.uniform(0.3, 60.0) for _ in range(workers)]
    trend = rng.choice([0.0, 0.0, 0.02, -0.01, 0.08])
    vram = [rng.randint(600_000_000, 30 * GI) for _ in range(workers)]
    window_end: list[int | None] = [None] * workers
    out = []
    t = start_s * 10**9
    for _ in range(ticks):
        samples = []
        for _ in range(rng.randint(3, 12)):
            t += spacing_s * 10**9 + rng.randint(0, 999_999_999)
            for w in range(workers):
                levels[w] = max(0.0, levels[w] * (1 + trend) + rng.gauss(0, levels[w] * 0.1 + 0.05))
                tflops = round(levels[w], 4) if rng.random() > 0.02 else 0.0
                end = window_end[w]
                if end is None or t >= end:
                    # a new 24-hour window: its first sample is its peak unless VRAM rises
                    window_end[w] = t + 24 * HOUR_NS if end is None else \
                        end + ((t - end) // (24 * HOUR_NS) + 1) * 24 * HOUR_NS
                    vram[w] = max(200_000_000, int(vram[w] * rng.uniform(0.7, 1.4)))
                    used = vram[w]
                elif rising_vram and rng.random() < 0.3:
                    vram[w] = int(vram[w] * rng.uniform(1.0, 1.25))
                    used = vram[w]
                else:
                    used = int(vram[w] * rng.uniform(0.5, 1.0))
                samples.append({"worker": f"w{w}", "tflops": tflops, "vram": used, "unix_ns": t})
        out.append({"samples": samples})
    return out


def cases() -> list[dict[str, Any]]:
    out = []
    for seed in range(40):
        rng = random.Random(seed)
        rising = seed >= 32
        spacing = rng.choice([15, 30, 60, 600, 3600])  # the last ones span days and many half-lives
        case = {
            "name": f"{'vram_peak_replaced' if rising else 'exact'}_{seed}",
            "qos": rng.choice(["low", "medium", "high", "critical", ""]),
            "creation_age_ns": 10 * HOUR_NS,
            "history_period": rng.choice(["", "2h", "1h", "90m", "45m", "24h"]),
            "resources": _resources(rng),
            "auto_set_resources": _auto_set(rng),
            "ticks": _stream(rng, rng.randint(1, 3) if not rising else rng.randint(2, 3),
                             rng.randint(4, 10), spacing, BASE_UNIX_S + seed * 7919, rising),
        }
        out.append(case)
    young = dict(out[0], name="exact_initial_delay", creation_age_ns=0)
    out.append(young)
    # initialDelayPeriod 0s is no delay (percentile_recommender.go reads it with time.ParseDuration)
    no_delay = dict(out[1], name="exact_zero_initial_delay", creation_age_ns=0,
                    auto_set_resources={**out[1]["auto_set_resources"], "initialDelayPeriod": "0s"})
    out.append(no_delay)
    out += _long_history_cases()
    # two streams where a percentile falls exactly between two samples' buckets, so the last bit of each
    # sample's decay weight decides it (Go's math.Exp2, not the C library's)
    out += [dict(c, name=f"exact_last_bit_{c['name']}")
            for c in random_streams(1198, 1) + random_streams(5144, 1)]
    return out


def random_streams(first: int, count: int) -> list[dict[str, Any]]:
    """Random streams for the parity count (``parity.py``): random QoS (the empty one too), initial delays
    (``0s`` too) and history periods up to 90 days."""
    out = []
    for seed in range(first, first + count):
        rng = random.Random(seed)
        rising = rng.random() < 0.2
        asr = _auto_set(rng)
        asr["initialDelayPeriod"] = rng.choice(["", "", "0s", "5m", "20h"])
        out.append({
            "name": f"parity_{seed}",
            "qos": rng.choice(["low", "medium", "high", "critical", ""]),
            "creation_age_ns": rng.choice([0, 10 * HOUR_NS]),
            "history_period": rng.choice(["", "2h", "45m", "24h", "720h", "1000h", "2160h"]),
            "resources": _resources(rng),
            "auto_set_resources": asr,
            "ticks": _stream(rng, rng.randint(1, 3), rng.randint(3, 10),
                             rng.choice([15, 60, 600, 3600, 7200]), BASE_UNIX_S + seed * 7919, rising),
        })
    return out


def _long_history_cases() -> list[dict[str, Any]]:
    """historyDataPeriod over 30 days: the half-life stays half the period (workload.go)."""
    ticks = []
    t = BASE_UNIX_S * 10**9
    for day in range(25):
        samples = []
        for hour in range(24):
            t += HOUR_NS
            level = 10.0 if day < 20 else 30.0
            samples.append({"worker": "w0", "tflops": level, "vram": (4 if hour else 6) * GI, "unix_ns": t})
        ticks.append({"samples": samples})
    asr = {"enable": True, "targetResource": "all", "targetComputePercentile": "0.72",
           "lowerBoundComputePercentile": "0.72", "upperBoundComputePercentile": "0.9"}
    resources = {"requests.tflops": "10", "limits.tflops": "10", "requests.vram": "8Gi", "limits.vram": "8Gi"}
    return [{"name": f"exact_history_{period}", "qos": qos, "creation_age_ns": 10 * HOUR_NS,
             "history_period": period, "resources": resources, "auto_set_resources": asr, "ticks": ticks}
            for period, qos in (("1000h", "high"), ("2160h", "low"), ("720h", "high"))]


# -- cron ------------------------------------------------------------------------------------------------

CRON_ZONES = ("UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kolkata")
# robfig's grammar at its edges, accepted and refused by TensorFusion's parser
CRON_PARSE = [
    "0 9 * * *", "0 9 ? * *", "0 9 * * ?", "? ? ? ? ?", "0 9 */2 * 1", "0 9 * * 1/2", "0 9 1,,15 * *",
    "0 9 ,1 * *", "*-5 * * * *", "?-x * * * *", "+5 0 * * *", "05 00 * * *", "0 0 * * SUN-sat",
    "0 0 * jan,DEC *",
    "0 0 * * 7", "0 0 * * 0-7", "0 0 0 * *", "0 0 32 * *", "0 24 * * *", "60 0 * * *", "0 0 * 13 *",
    "0 0 * 0 *", "*/0 * * * *", "1-2-3 * * * *", "1/2/3 * * * *", "-1 * * * *", "1- * * * *", "/5 * * * *",
    "5-3 * * * *", "0 0 * * MON-FUN", "0 0 * * monday", "@daily", "@hourly", "@every 1h", "@midnight",
    "* * * *", "* * * * * *", " ", "0  9\t* *  *", "CRON_TZ=Europe/Berlin 0 9 * * 1-5",
    "TZ=America/New_York 30 1 * * *", "CRON_TZ=Mars/Olympus 0 9 * * *", "CRON_TZ= 0 9 * * *",
    "CRON_TZ=UTC @daily", "TZ=Europe/Berlin\t0 9 * * *", " CRON_TZ=UTC 0 9 * * *", "0 9 * * * ",
    "*/1 * * * *", "0 9 1-31/7 * *", "0 9 L * *", "0 9 15W * *", "0 9 * * 1#2", "0 0 29 2 *", "0x1 * * * *",
    "1.5 * * * *", "0 0 */31 * *", "0 0 * * */7",
]


def _field(rng: random.Random, low: int, high: int, names: list[str] | None) -> str:
    def value() -> str:
        if names and rng.random() < 0.2:
            return rng.choice(names)
        return str(rng.randint(low, high + (1 if rng.random() < 0.05 else 0)))
    def item() -> str:
        kind = rng.random()
        if kind < 0.3:
            return rng.choice(["*", "*", "?"])
        if kind < 0.5:
            return f"{rng.choice(['*', '?'])}/{rng.randint(1, 5)}"
        if kind < 0.7:
            return value()
        a, b = sorted((rng.randint(low, high), rng.randint(low, high)))
        return f"{a}-{b}" + (f"/{rng.randint(1, 4)}" if rng.random() < 0.3 else "")
    return ",".join(item() for _ in range(1 if rng.random() < 0.8 else 2))


def random_cron(rng: random.Random) -> str:
    days = ["sun", "MON", "tue", "Wed", "thu", "fri", "sat"]
    months = ["jan", "FEB", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    minute = rng.choice([str(rng.randint(0, 59)), f"*/{rng.randint(5, 30)}", "0,30", "0-10"])
    hour = rng.choice([str(rng.randint(0, 23)), "1-3", "*/6", "*", "2"])
    return " ".join((minute, hour, _field(rng, 1, 31, None), _field(rng, 1, 12, months) if rng.random() < 0.3
                     else "*", _field(rng, 0, 6, days)))


def _dst_instants() -> list[int]:
    """Around the 2026 daylight-saving changes of New York (8 March, 1 November) and Berlin (29 March,
    25 October), every 10 minutes from 3 hours before to 3 hours after."""
    changes = ["2026-03-08T07:00:00", "2026-11-01T06:00:00", "2026-03-29T01:00:00", "2026-10-25T01:00:00"]
    import datetime as dt
    out = []
    for text in changes:
        at = int(dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp())
        out += [(at + m * 60) * 10**9 for m in range(-180, 181, 10)]
    return out


def cron_cases() -> dict[str, Any]:
    rng = random.Random(43)
    parse = [*CRON_PARSE, *(random_cron(rng) for _ in range(150))]
    next_cases = []
    dst = _dst_instants()
    fixed = ["30 1 * * *", "30 2 * * *", "*/20 1-3 * * *", "0 2 * * 0", "0 0 * * *", "0 0 29 2 *",
             "0 0 30 2 *",
             "0 9 */2 * 1", "0 9 1 * */2", "0 3 */3 * *"]
    for expr in fixed:
        for zone in ("America/New_York", "Europe/Berlin"):
            next_cases += [{"expr": expr, "zone": zone, "unix_ns": t} for t in dst[::3]]
    for _ in range(600):
        expr = random_cron(rng)
        unix_s = BASE_UNIX_S + rng.randint(0, 400 * 86400) + rng.choice([0, 0, rng.randint(0, 59)])
        next_cases.append({"expr": expr, "zone": rng.choice(CRON_ZONES), "unix_ns": unix_s * 10**9 + 123})
    return {"parse": parse, "next": next_cases, "cases": _rule_cases(rng, dst)}


def _rule(name: str, start: str, end: str, tflops: str = "32") -> dict[str, Any]:
    return {"enable": True, "name": name, "start": start, "end": end,
            "desiredResources": {"requests": {"tflops": tflops, "vram": "8Gi"},
                                 "limits": {"tflops": tflops, "vram": "8Gi"}}}


def _rule_cases(rng: random.Random, dst: list[int]) -> list[dict[str, Any]]:
    resources = {"requests.tflops": "1", "limits.tflops": "1", "requests.vram": "2Gi", "limits.vram": "2Gi"}
    week = [(BASE_UNIX_S + h * 1800 + 7) * 10**9 for h in range(0, 7 * 48)]  # a week, every half hour
    out = [
        # */k in a day field: either day field may match (robfig's star bit)
        {"name": "cron_step_in_day_of_month", "rules": [_rule("a", "0 9 */2 * 1", "0 17 */2 * 1")],
         "ticks": week},
        {"name": "cron_step_in_day_of_week", "rules": [_rule("a", "0 9 1 * */2", "0 17 1 * */2")],
         "ticks": week},
        {"name": "cron_question_mark", "rules": [_rule("a", "0 9 ? * 1-5", "0 17 ? * 1-5")], "ticks": week},
        # a schedule that never fires (30 February) has robfig's zero time as its next firing, which
        # TensorFusion's comparison reads as the earliest time
        {"name": "cron_start_never_fires", "rules": [_rule("a", "0 0 30 2 *", "0 17 * * *")],
         "ticks": week[:8]},
        {"name": "cron_end_never_fires", "rules": [_rule("a", "0 9 * * *", "0 0 30 2 *")], "ticks": week[:8]},
        {"name": "cron_neither_fires", "rules": [_rule("a", "0 0 30 2 *", "0 0 31 2 *")], "ticks": week[:8]},
    ]
    for zone in ("America/New_York", "Europe/Berlin"):
        for start, end in (("30 1 * * *", "50 1 * * *"), ("30 2 * * *", "50 2 * * *"),
                           ("0 1 * * *", "0 3 * * *"), ("15 2 * * *", "45 1 * * *")):
            out.append({"name": f"cron_dst_{zone.split('/')[1].lower()}_{start.replace(' ', '_')}",
                        "rules": [_rule("a", f"CRON_TZ={zone} {start}", f"CRON_TZ={zone} {end}")],
                        "ticks": dst})
    for i in range(40):
        rules = [_rule(f"r{j}", random_cron(rng), random_cron(rng), str(rng.choice([2, 8, 32])))
                 for j in range(rng.choice([1, 1, 2]))]
        zone = rng.choice(CRON_ZONES)
        for rule in rules:
            if rng.random() < 0.5:
                rule["start"] = f"CRON_TZ={zone} {rule['start']}"
                rule["end"] = f"CRON_TZ={zone} {rule['end']}"
        start = BASE_UNIX_S + rng.randint(0, 300 * 86400)
        step = rng.choice([600, 1800, 3600, 4 * 3600])
        ticks = [(start + k * step + 11) * 10**9 for k in range(rng.randint(20, 120))]
        out.append({"name": f"cron_random_{i}", "rules": rules, "ticks": ticks})
    return [{**c, "resources": resources, "ticks": [{"unix_ns": t} for t in c["ticks"]]} for c in out]


if __name__ == "__main__":
    json.dump(cron_cases() if sys.argv[1:] == ["cron"] else cases(), sys.stdout)
