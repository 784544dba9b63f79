#!/usr/bin/env python3
"""One summary of the peer runs: reads the JSON files run_peers.sh wrote and prints short tables."""

import argparse
import json
import os
import sys

from peer_common import SIZE_ORDER, format_table

# From the first PyTorch run on an H200 (issue 6): what the goals were set against.
EARLIER_H200 = {
    ("large", "fwd", "compile"): 8.98,
    ("large", "fwdbwd", "compile"): 27.4,
    ("large", "fwd", "compile_fp8"): 5.58,
}
EARLIER_TINY_EAGER_HOST_US = 67.0
MLP_VARIANTS = ["eager", "compile", "compile_autotune", "compile_fp8", "eager_fp8"]
GEMM_VARIANTS = ["bf16", "fp8_fast", "fp8"]


def load(path):
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def measured(results):
    return [r for r in results if "median_ms" in r]


def pivot(results, keys, field):
    """One row per distinct `keys`, one column per variant holding that variant's `field`."""
    rows = {}
    for result in results:
        row = rows.setdefault(tuple(result[k] for k in keys), {k: result[k] for k in keys})
        row[result["variant"]] = result.get(field)
    return list(rows.values())


def size_mode_order(row):
    return (SIZE_ORDER.index(row["size"]), row["mode"])


def mlp_summary(data):
    results = measured(data["results"])
    variants = [v for v in MLP_VARIANTS if any(r["variant"] == v for r in results)]
    keys = [("size", "size", ""), ("mode", "mode", "")]
    sections = [
        ("median ms per call, calls issued back to back", "median_ms", ".4f"),
        ("device-only ms per call (queued behind a sleep kernel)", "gpu_median_ms", ".4f"),
        ("host us per call", "host_us", ".1f"),
        ("first call (torch.compile included), s", "first_call_s", ".1f"),
    ]
    for title, field, spec in sections:
        shown = [v for v in variants if field != "first_call_s" or v.startswith("compile")]
        rows = sorted(pivot(results, ["size", "mode"], field), key=size_mode_order)
        rows = [r for r in rows if any(r.get(v) is not None for v in shown)]
        if not rows:
            continue
        for row in rows:
            if field == "median_ms" and row.get("compile") and row.get("compile_fp8"):
                row["fp8/compile"] = row["compile_fp8"] / row["compile"]
        extra = [("fp8/compile", "fp8/compile", ".2f")] if field == "median_ms" else []
        print(f"\n{title}:")
        print(format_table(keys + [(v, v, spec) for v in shown] + extra, rows))

    by_key = {(r["size"], r["mode"], r["variant"]): r for r in results}
    print("\nagainst the earlier H200 run (issue 6):")
    for key, earlier in EARLIER_H200.items():
        now = by_key.get(key)
        text = f"{now['median_ms']:.2f} ms ({now['median_ms'] / earlier:.2f}x)" if now else "-"
        print(f"  {' '.join(key):28s} earlier {earlier:6.2f} ms, now {text}")
    tiny = by_key.get(("tiny", "fwd", "eager"))
    if tiny and tiny.get("host_us") is not None:
        print(
            f"  {'tiny fwd eager host/call':28s} earlier {EARLIER_TINY_EAGER_HOST_US:6.1f} us, "
            f"now {tiny['host_us']:.1f} us"
        )
    for result in data["results"]:
        if "error" in result or "skipped" in result:
            what = result.get("error") or "skipped, " + result["skipped"]
            print(f"  {result['size']} {result['mode']} {result['variant']}: {what}")


def gemm_summary(data):
    results = measured(data["results"])
    keys = ["size", "gemm", "m", "n", "k"]
    key_columns = [("size", "size", ""), ("gemm", "gemm", "")]
    key_columns += [(k, k, "d") for k in ("m", "n", "k")]
    sections = [
        ("median ms per call, calls issued back to back", "median_ms", ".4f"),
        ("device-only ms per call (queued behind a sleep kernel)", "gpu_median_ms", ".4f"),
        ("TFLOP/s from the back-to-back median", "tflops", ".0f"),
    ]
    for title, field, spec in sections:
        rows = pivot(results, keys, field)
        if all(row.get(v) is None for row in rows for v in GEMM_VARIANTS):
            continue  # a field this run did not measure
        print(f"\n{title}:")
        print(format_table(key_columns + [(v, v, spec) for v in GEMM_VARIANTS], rows))
    for result in data["results"]:
        if "error" in result:
            print(f"  {result['size']} {result['gemm']} {result['variant']}: {result['error']}")


def copy_summary(data):
    columns = [
        ("shape", "shape", ""),
        ("MB moved", "mbytes_moved", ".0f"),
        ("TB/s", "tb_per_s", ".2f"),
        ("device-only TB/s", "gpu_tb_per_s", ".2f"),
    ]
    print(format_table(columns, measured(data["results"])))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "directory", help="where peers_copy.json, peers_gemm.json, peers_mlp.json are"
    )
    args = parser.parse_args(argv)
    sections = [
        ("peers_copy.json", "device copy bandwidth (bytes read + written)", copy_summary),
        ("peers_gemm.json", "GEMMs D[m,n] = A[m,k] B[n,k]^T", gemm_summary),
        ("peers_mlp.json", "seed MLP", mlp_summary),
    ]
    for name, title, summarize in sections:
        data = load(os.path.join(args.directory, name))
        if data is None:
            print(f"\n== {title}: {name} missing")
            continue
        where = f"{data['device']}, torch {data['torch']}, CUDA {data['cuda']}, {data['date']}"
        print(f"\n== {title}: {where}")
        summarize(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
