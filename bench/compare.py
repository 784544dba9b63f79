#!/usr/bin/env python3
"""opfuse next to its PyTorch peers: one side-by-side table from the JSON of one device run.

Reads, from one directory, every `opfuse_*.json` that `fusec bench --json` wrote and the peers'
`peers_mlp.json`, `peers_gemm.json` and `peers_copy.json` (bench/peers/run_peers.sh), and where
present `peers_gemm_interleaved.json`, `peers_mlp_interleaved.json` and
`peers_mlp_interleaved_fwdbwd_RECIPE.json` (both sides in one process, the forward and the training
step: bench/peers/gemm_interleaved.py, mlp_interleaved.py), `peers_gemm_kernels.json` (the step's
GEMMs against TE's, bench/peers/gemm_kernels.py) and `peers_te.json` (Transformer
Engine, bench/peers/te_peers.py), and prints: the MLP workloads (opfuse vs eager bf16,
torch.compile bf16 and torch.compile FP8, and TE under the same recipe, with ratios), the goals of issue
6 (met or missed), the fused memory-bound kernels against the device copy bandwidth, and opfuse's
GEMMs against torch._scaled_mm / torch.matmul on the same shapes.
Writes everything it printed as data to DIR/compare.json.
"""

import argparse
import glob
import json
import os
import sys

SIZE_ORDER = ["tiny", "medium", "large"]
RECIPE_ORDER = ["fp8 delayed", "fp8 current", "fp8 block", "mxfp8", "nvfp4", "bf16"]
# Issue 6's goals, from the first PyTorch run on an H200.
GOAL_FWD_VS_COMPILE_FP8 = 0.83
GOAL_FWD_VS_COMPILE = 0.52
GOAL_FWDBWD_VS_COMPILE = 0.55
GOAL_COPY_SHARE = 0.85
GOAL_HOST_US = 10.0
GOAL_GRAPH_HOST_US = 5.0
GOAL_GEMM_RATIO = 1.03
# Issue 18: the large forward+backward under float8_block_scaling against torch.compile bf16.
GOAL_BLOCK_FWDBWD_VS_COMPILE = 0.70
# Issue 22: the large forward+backward against Transformer Engine under the same recipe.
GOAL_FWDBWD_VS_TE_DELAYED = 0.90
GOAL_FWDBWD_VS_TE = 0.95


def load(path):
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def recipe_label(recipe):
    if recipe.startswith("delayed_scaling"):
        return "fp8 delayed"
    if recipe.startswith("current_scaling"):
        return "fp8 current"
    if recipe.startswith("float8_block_scaling"):
        return "fp8 block"
    if recipe.startswith("mxfp8_block_scaling"):
        return "mxfp8"
    if recipe.startswith("nvfp4_block_scaling"):
        return "nvfp4"
    return "bf16" if recipe.startswith("bf16") else recipe


def size_of(run):
    stem = os.path.splitext(os.path.basename(run["file"]))[0]
    return stem.split("_")[-1] if stem.split("_")[-1] in SIZE_ORDER else stem


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def table(columns, rows):
    """columns: (header, key, format spec); rows: dicts. Right-aligned fixed-width text."""
    cells = [[fmt(row.get(key), spec) for _, key, spec in columns] for row in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _, _) in enumerate(columns)]
    lines = ["  ".join(h.rjust(w) for (h, _, _), w in zip(columns, widths, strict=True))]
    lines.append("-" * len(lines[0]))
    lines += ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in cells]
    return "\n".join(lines)


def ratio(a, b):
    return a / b if a is not None and b else None


def peer_mlp(peers):
    """(size, mode, variant) -> the peers' record with a median."""
    if not peers:
        return {}
    return {
        (r["size"], r["mode"], r["variant"]): r for r in peers["results"] if "median_ms" in r
    }


def run_label(run):
    """The mode column: fwd / fwdbwd, plus how the run differs from a default session."""
    label = run["mode"] + (" graph" if run["graph"] else "")
    if run.get("gemm_algorithms") == "autotuned":
        label += " tuned"
    if not run.get("auto_graph", True) and run["mode"] == "fwd" and not run["graph"]:
        label += " step-by-step"
    return label


# Transformer Engine's variant of each recipe (bench/peers/te_peers.py).
TE_VARIANTS = {
    "fp8 delayed": "te_fp8_delayed",
    "fp8 current": "te_fp8_current",
    "fp8 block": "te_fp8_block",
    "bf16": "te_bf16",
}


def workload_rows(runs, mlp, te=None):
    """One row per opfuse run with its PyTorch peers and, where peers_te.json measured it, TE
    under the same recipe (same size and mode)."""
    te = te or {}
    rows = []
    for run in runs:
        size, mode = size_of(run), run["mode"]

        def peer(variant, field="median_ms", size=size, mode=mode):
            record = mlp.get((size, mode, variant))
            return record.get(field) if record else None

        row = {
            "workload": size,
            "mode": run_label(run),
            "recipe": recipe_label(run["recipe"]),
            "opfuse_ms": run["time_ms"]["median"],
            "opfuse_device_ms": run["device_time_ms"]["median"],
            "tflops": run["tflops"],
            "host_us": run["host_us"]["median"],
            "peak_mib": run["memory"]["peak_bytes"] / 2**20,
            "compile_ms": run["compile"]["wall_ms"],
            "eager_ms": peer("eager"),
            "torch_compile_ms": peer("compile"),
            "torch_compile_fp8_ms": peer("compile_fp8"),
            "torch_compile_fp8_device_ms": peer("compile_fp8", "gpu_median_ms"),
            "torch_compile_device_ms": peer("compile", "gpu_median_ms"),
        }
        row["x_eager"] = ratio(row["opfuse_ms"], row["eager_ms"])
        row["x_compile"] = ratio(row["opfuse_ms"], row["torch_compile_ms"])
        row["x_compile_fp8"] = ratio(row["opfuse_ms"], row["torch_compile_fp8_ms"])
        row["x_compile_device"] = ratio(row["opfuse_device_ms"], row["torch_compile_device_ms"])
        te_record = te.get((size, mode, TE_VARIANTS.get(row["recipe"])))
        # Only a default run (no graph, no autotuning) stands for opfuse against TE's defaults.
        if te_record and run_label(run) == mode:
            row["te_ms"] = te_record["median_ms"]
            row["te_device_ms"] = te_record.get("gpu_median_ms")
            row["x_te"] = ratio(row["opfuse_ms"], row["te_ms"])
            row["x_te_device"] = ratio(row["opfuse_device_ms"], row["te_device_ms"])
        rows.append(row)

    def order(row):
        return (
            SIZE_ORDER.index(row["workload"]) if row["workload"] in SIZE_ORDER else 9,
            row["mode"],
            RECIPE_ORDER.index(row["recipe"]) if row["recipe"] in RECIPE_ORDER else 9,
        )

    return sorted(rows, key=order)


def goal(what, value, limit, smaller_is_better=True, unit="x"):
    if value is None:
        status = "not measured"
    else:
        met = value <= limit if smaller_is_better else value >= limit
        status = "MET" if met else "MISSED"
    return {
        "goal": what,
        "value": value,
        "limit": limit,
        "status": status,
        "text": f"{what}: {fmt(value, '.3f')}{unit} (limit {limit}{unit}) {status}",
    }


def goals(rows, runs):
    found = []
    for row in rows:
        fp8 = row["recipe"].startswith("fp8")
        first = row["mode"].split()[0]
        if row["workload"] == "large" and fp8 and first == "fwd":
            found.append(
                goal(
                    f"large {row['recipe']} {row['mode']} vs torch.compile FP8",
                    row["x_compile_fp8"],
                    GOAL_FWD_VS_COMPILE_FP8,
                )
            )
            found.append(
                goal(
                    f"large {row['recipe']} {row['mode']} vs torch.compile bf16",
                    row["x_compile"],
                    GOAL_FWD_VS_COMPILE,
                )
            )
        if row["workload"] == "large" and fp8 and first == "fwdbwd":
            block = row["recipe"] == "fp8 block"
            found.append(
                goal(
                    f"large {row['recipe']} {row['mode']} vs torch.compile bf16",
                    row["x_compile"],
                    GOAL_BLOCK_FWDBWD_VS_COMPILE if block else GOAL_FWDBWD_VS_COMPILE,
                )
            )
        # "fwd step-by-step" (--no-auto-graph) shows the per-launch host cost the session's
        # automatic graph removes; the goal is on what a forward() costs by default.
        if row["workload"] == "tiny" and first == "fwd" and "step-by-step" not in row["mode"]:
            graph = "graph" in row["mode"]
            found.append(
                goal(
                    f"tiny {row['recipe']} {row['mode']} host time per call",
                    row["host_us"],
                    GOAL_GRAPH_HOST_US if graph else GOAL_HOST_US,
                    unit=" us",
                )
            )
    for run in runs:
        if size_of(run) == "large" and not run["graph"]:
            share = run["summary"]["kernel_copy_share"] or None
            label = f"large {recipe_label(run['recipe'])} {run_label(run)} generated kernels vs copy"
            found.append(goal(label, share, GOAL_COPY_SHARE, smaller_is_better=False, unit=""))
    return found


def kernel_rows(runs, peer_copy):
    """The generated kernels of the large runs (fwdbwd first, so a forward kernel that both modes
    run is listed once); the smaller sizes are in each run's JSON."""
    rows = []
    seen = set()
    large = [run for run in runs if size_of(run) == "large" and not run["graph"]]
    for run in sorted(large, key=lambda run: run["mode"] != "fwdbwd"):
        for step in run["steps"]:
            if step["kind"] != "kernel" or not step["ran"]:
                continue
            key = (recipe_label(run["recipe"]), step["what"])
            if key in seen:
                continue
            seen.add(key)
            rows.append(
                {
                    "workload": size_of(run),
                    "mode": run["mode"],
                    "recipe": recipe_label(run["recipe"]),
                    "step": step["index"],
                    "what": step["what"][:50],
                    "mb": (step["bytes_read"] + step["bytes_written"]) / 1e6,
                    "us": step["time_ms"]["median"] * 1e3,
                    "gb_per_s": step["gb_per_s"],
                    "copy_share": 100 * step["copy_share"],
                    "copy_gb_per_s": run["copy"]["gb_per_s"],
                    "torch_copy_gb_per_s": peer_copy,
                }
            )
    return rows


def peer_gemms(peers):
    """(m, n, k, variant) -> the peers' device-only median (back-to-back where missing)."""
    if not peers:
        return {}
    table_ = {}
    for r in peers["results"]:
        if "median_ms" in r:
            table_[(r["m"], r["n"], r["k"], r["variant"])] = r.get("gpu_median_ms") or r["median_ms"]
    return table_


def gemm_rows(runs, peers):
    rows = []
    seen = set()
    for run in runs:
        # Tiny GEMMs take a few microseconds: launch-bound on both sides, not a GEMM comparison.
        if run["graph"] or size_of(run) == "tiny":
            continue
        for step in run["steps"]:
            if step["kind"] != "gemm" or not step["ran"]:
                continue
            fp8 = "e4m3" in step["dtypes"][:2] or "e5m2" in step["dtypes"][:2]
            variant = ("fp8_fast" if step["fast_accum"] else "fp8") if fp8 else "bf16"
            if fp8 and "e5m2" in step["dtypes"][:2] and not step["fast_accum"]:
                variant = "fp8_e5m2"  # the same operand formats as opfuse's dgrad/wgrad
            tuned = run.get("gemm_algorithms") == "autotuned"
            key = (size_of(run), step["role"], step["m"], step["n"], step["k"], tuple(step["dtypes"]))
            key += (tuned,)
            if key in seen:
                continue  # the same GEMM in fwd and fwdbwd runs
            seen.add(key)
            peer = peers.get((step["m"], step["n"], step["k"], variant))
            ms = step["time_ms"]["median"]
            rows.append(
                {
                    "workload": size_of(run),
                    "role": step["role"] + (" tuned" if tuned else ""),
                    "m": step["m"],
                    "n": step["n"],
                    "k": step["k"],
                    "dtypes": "x".join(step["dtypes"][:2]) + "->" + step["dtypes"][2],
                    "opfuse_ms": ms,
                    "tflops": step["tflops"],
                    "peer": variant,
                    "peer_ms": peer,
                    "x_peer": ratio(ms, peer),
                }
            )
    return rows


WORKLOAD_COLUMNS = [
    ("workload", "workload", ""),
    ("mode", "mode", ""),
    ("recipe", "recipe", ""),
    ("opfuse ms", "opfuse_ms", ".4f"),
    ("dev-only", "opfuse_device_ms", ".4f"),
    ("TFLOP/s", "tflops", ".0f"),
    ("host us", "host_us", ".1f"),
    ("eager ms", "eager_ms", ".4f"),
    ("compile ms", "torch_compile_ms", ".4f"),
    ("compile-FP8 ms", "torch_compile_fp8_ms", ".4f"),
    ("x eager", "x_eager", ".2f"),
    ("x compile", "x_compile", ".2f"),
    ("x compile-FP8", "x_compile_fp8", ".2f"),
    ("x compile dev", "x_compile_device", ".2f"),
]
# Added when peers_te.json is present.
TE_COLUMNS = [
    ("TE ms", "te_ms", ".4f"),
    ("x TE", "x_te", ".2f"),
    ("x TE dev", "x_te_device", ".2f"),
]
KERNEL_COLUMNS = [
    ("workload", "workload", ""),
    ("mode", "mode", ""),
    ("recipe", "recipe", ""),
    ("step", "step", "d"),
    ("MB", "mb", ".1f"),
    ("us", "us", ".1f"),
    ("GB/s", "gb_per_s", ".0f"),
    ("% copy", "copy_share", ".0f"),
    ("what", "what", ""),
]
GEMM_COLUMNS = [
    ("workload", "workload", ""),
    ("gemm", "role", ""),
    ("m", "m", "d"),
    ("n", "n", "d"),
    ("k", "k", "d"),
    ("dtypes", "dtypes", ""),
    ("opfuse ms", "opfuse_ms", ".4f"),
    ("TFLOP/s", "tflops", ".0f"),
    ("peer", "peer", ""),
    ("peer ms", "peer_ms", ".4f"),
    ("x peer", "x_peer", ".3f"),
]


INTERLEAVED_COLUMNS = [
    ("workload", "size", ""),
    ("gemm", "gemm", ""),
    ("m", "m", "d"),
    ("n", "n", "d"),
    ("k", "k", "d"),
    ("operands", "variant", ""),
    ("opfuse ms", "opfuse_ms", ".4f"),
    ("torch ms", "torch_ms", ".4f"),
    ("x torch", "ratio", ".3f"),
    ("min", "ratio_min", ".3f"),
    ("max", "ratio_max", ".3f"),
    ("same bits", "same_bits", ""),
]


def interleaved_rows(data):
    """The results of gemm_interleaved.py or mlp_interleaved.py (bench/peers): both sides in one
    process, alternating; failed entries (no ratio) left out."""
    if not data:
        return []
    return [r for r in data["results"] if "ratio" in r]


MLP_INTERLEAVED_COLUMNS = [
    ("workload", "size", ""),
    ("recipe", "recipe", ""),
    ("GEMMs", "gemm_algorithms", ""),
    ("peer", "peer", ""),
    ("opfuse ms", "opfuse_ms", ".4f"),
    ("peer ms", "peer_ms", ".4f"),
    ("x peer", "ratio", ".3f"),
    ("min", "ratio_min", ".3f"),
    ("max", "ratio_max", ".3f"),
]
MLP_INTERLEAVED_GOALS = {
    "compile_fp8": ("torch.compile FP8", GOAL_FWD_VS_COMPILE_FP8),
    "compile": ("torch.compile bf16", GOAL_FWD_VS_COMPILE),
}


def mlp_interleaved_goals(rows):
    """The large forward's goals as bench/peers/mlp_interleaved.py measured them."""
    listed = []
    for r in rows:
        if r["peer"] in MLP_INTERLEAVED_GOALS:
            name, limit = MLP_INTERLEAVED_GOALS[r["peer"]]
            tuned = " autotuned GEMMs" if r.get("gemm_algorithms") == "autotuned" else ""
            what = (f"{r['size']} {r['recipe'].replace('_', ' ')} fwd{tuned} vs {name}"
                    " (interleaved)")
            listed.append(goal(what, r["ratio"], limit))
    return listed


# Issue 22: every GEMM of the large MLP at least as fast as TE's same GEMM (gemm_kernels.py).
GOAL_GEMM_VS_TE = 1.00

GEMM_KERNEL_COLUMNS = [
    ("#", "position", ""),
    ("kernel (opfuse)", "kernel", ""),
    ("same as TE's", "same_kernel", ""),
    ("TE ms", "te_ms", ".3f"),
    ("opfuse ms", "opfuse_ms", ".3f"),
    ("opfuse / TE", "ratio", ".3f"),
]


def gemm_kernel_rows(data):
    """bench/peers/gemm_kernels.py's profile of one training step per side, in rounds whose side
    order rotates: per GEMM (launch order) the kernel each side ran and its mean device time over
    the rounds, TE's and opfuse's (on the same tensors)."""
    if not data or not data.get("rounds"):
        return []
    rounds = [r for r in data["rounds"] if "te" in r and "opfuse" in r]
    if not rounds:
        return []
    rows = []
    for position, first in enumerate(rounds[0]["opfuse"]["gemms"]):
        te = [r["te"]["gemms"][position] for r in rounds]
        ours = [r["opfuse"]["gemms"][position] for r in rounds]
        te_ms = sum(g["mean_us"] for g in te) / len(te) / 1e3
        opfuse_ms = sum(g["mean_us"] for g in ours) / len(ours) / 1e3
        rows.append({"position": position, "kernel": first["kernel"],
                     "same_kernel": all(a["kernel"] == b["kernel"] for a, b in zip(te, ours)),
                     "te_ms": te_ms, "opfuse_ms": opfuse_ms, "ratio": opfuse_ms / te_ms,
                     "rounds": len(rounds), "recipe": data.get("recipe"), "size": data.get("size")})
    return rows


# The training step interleaved (mlp_interleaved.py --mode fwdbwd): (recipe, peer) -> goal.
TRAINING_INTERLEAVED_GOALS = {
    ("fp8_delayed", "te"): ("Transformer Engine", GOAL_FWDBWD_VS_TE_DELAYED),
    ("fp8_current", "te"): ("Transformer Engine", GOAL_FWDBWD_VS_TE),
    ("bf16", "te"): ("Transformer Engine", GOAL_FWDBWD_VS_TE),
    ("fp8_delayed", "compile"): ("torch.compile bf16", GOAL_FWDBWD_VS_COMPILE),
    ("fp8_block", "compile"): ("torch.compile bf16", GOAL_BLOCK_FWDBWD_VS_COMPILE),
}


def training_interleaved_rows(directory):
    """Every `peers_mlp_interleaved_fwdbwd_RECIPE.json` (bench/run_gpu.sh: the training step
    interleaved, one file per recipe), failed entries left out."""
    rows = []
    for path in sorted(glob.glob(os.path.join(directory, "peers_mlp_interleaved_fwdbwd_*.json"))):
        rows += [{"gemm_algorithms": "heuristic", **r} for r in interleaved_rows(load(path))]
    return rows


def training_interleaved_goals(rows):
    """Issues 18's and 22's training-step goals as the interleaved measurement found them."""
    listed = []
    for r in rows:
        key = (r["recipe"], r["peer"])
        if key in TRAINING_INTERLEAVED_GOALS:
            name, limit = TRAINING_INTERLEAVED_GOALS[key]
            what = f"{r['size']} {r['recipe'].replace('_', ' ')} fwd+bwd vs {name} (interleaved)"
            listed.append(goal(what, r["ratio"], limit))
    return listed


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", help="where opfuse_*.json and peers_*.json are")
    args = parser.parse_args(argv)
    runs = []
    for path in sorted(glob.glob(os.path.join(args.directory, "opfuse_*.json"))):
        data = load(path)
        if data and data.get("tool") == "fusec bench":
            runs.append(data)
    mlp = load(os.path.join(args.directory, "peers_mlp.json"))
    gemm = load(os.path.join(args.directory, "peers_gemm.json"))
    copy = load(os.path.join(args.directory, "peers_copy.json"))
    peer_copy = None
    if copy:
        rates = [r["gpu_tb_per_s"] or r["tb_per_s"] for r in copy["results"] if "tb_per_s" in r]
        peer_copy = 1e3 * max(rates) if rates else None

    device = runs[0]["device"]["name"] if runs else (mlp or {}).get("device", "?")
    print(f"\n=== opfuse vs PyTorch on {device}: {len(runs)} opfuse runs")
    if mlp:
        print(f"peers: torch {mlp['torch']}, CUDA {mlp['cuda']}, {mlp['date']}")
    te = load(os.path.join(args.directory, "peers_te.json"))
    if te:
        print(f"peers: Transformer Engine {te.get('transformer_engine', '?')} (te.ops.Sequential)")
    rows = workload_rows(runs, peer_mlp(mlp), peer_mlp(te))
    goal_list = goals(rows, runs)
    kernels = kernel_rows(runs, peer_copy)
    gemms = gemm_rows(runs, peer_gemms(gemm))
    interleaved = interleaved_rows(load(os.path.join(args.directory, "peers_gemm_interleaved.json")))
    if interleaved:
        # The goal's measurement: both sides timed in one process in alternating rounds.
        worst = max(r["ratio"] for r in interleaved)
        goal_list.append(
            goal("worst FP8 GEMM vs torch._scaled_mm (interleaved)", worst, GOAL_GEMM_RATIO)
        )
    elif gemms:
        fp8 = [g["x_peer"] for g in gemms if g["peer"] != "bf16" and g["x_peer"] is not None]
        worst = max(fp8) if fp8 else None
        goal_list.append(goal("worst FP8 GEMM vs torch._scaled_mm", worst, GOAL_GEMM_RATIO))
    # The large forward against torch.compile, both in one process, call by call, after the
    # quantizer scales were calibrated (bench/peers/mlp_interleaved.py).
    # (Runs before --gemm-algorithms measured cuBLASLt's heuristic choice only.)
    mlp_interleaved = [
        {"gemm_algorithms": "heuristic", **r}
        for r in interleaved_rows(load(os.path.join(args.directory, "peers_mlp_interleaved.json")))
    ]
    goal_list += mlp_interleaved_goals(mlp_interleaved)
    training_interleaved = training_interleaved_rows(args.directory)
    goal_list += training_interleaved_goals(training_interleaved)
    gemm_kernels = gemm_kernel_rows(load(os.path.join(args.directory, "peers_gemm_kernels.json")))
    if gemm_kernels:
        worst = max(gemm_kernels, key=lambda r: r["ratio"])
        goal_list.append(goal(f"{worst['size']} {worst['recipe'].replace('_', ' ')} slowest GEMM "
                              f"vs TE's same GEMM (#{worst['position']}, profiled)",
                              worst["ratio"], GOAL_GEMM_VS_TE))
    copies = sorted({round(r["copy"]["gb_per_s"]) for r in runs})
    print(
        f"\nfused memory-bound kernels (large) vs device copy: opfuse's cudaMemcpyAsync "
        f"{copies} GB/s, torch copy_ {fmt(peer_copy, '.0f')} GB/s:"
    )
    print(table(KERNEL_COLUMNS, kernels) if kernels else "  none measured")
    print("\nGEMMs: opfuse's step (profiling pass) vs the peer on the same m, n, k (device-only):")
    print(table(GEMM_COLUMNS, gemms) if gemms else "  none measured")
    print(
        "  (peers: torch._scaled_mm with the same operand formats and accumulation: fp8_fast ="
        " E4M3 x E4M3 with fast accumulation, fp8_e5m2 = E5M2 x E4M3 without)"
    )
    if interleaved:
        print(
            "\nFP8 GEMMs interleaved: opfuse's GEMM runner and torch._scaled_mm in one process, on"
            " the same operands, issued alternately (x torch: median over rounds; min, max; same"
            " bits: identical results, i.e. the same kernel):"
        )
        print(table(INTERLEAVED_COLUMNS, interleaved))
    if mlp_interleaved:
        print(
            "\nseed MLP forward interleaved: an opfuse Session and torch.compile in one process,"
            " on the same inputs and parameters, issued alternately after the quantizer scales"
            " were calibrated (x peer: median over rounds; min, max):"
        )
        print(table(MLP_INTERLEAVED_COLUMNS, mlp_interleaved))
    if training_interleaved:
        print(
            "\nseed MLP training step interleaved: opfuse's forward, backward and quantizer update"
            " against each peer's forward and backward, in one process, on the same parameters,"
            " inputs and output gradients, issued alternately (x peer: median over rounds):"
        )
        print(table(MLP_INTERLEAVED_COLUMNS, training_interleaved))
    if gemm_kernels:
        print(
            f"\nthe large training step's GEMMs against TE's (gemm_kernels.py: one torch.profiler, "
            f"the same tensors, {gemm_kernels[0]['rounds']} rounds of rotating side order; mean"
            " device ms per step):"
        )
        print(table(GEMM_KERNEL_COLUMNS, gemm_kernels))
    print("\nseed MLP, median ms per call issued back to back (x: opfuse / peer; < 1 is faster):")
    print(table(WORKLOAD_COLUMNS + (TE_COLUMNS if te else []), rows))
    print("\ngoals (issue 6):")
    for item in goal_list:
        print("  " + item["text"])

    summary = {"device": device, "workloads": rows, "goals": goal_list, "kernels": kernels}
    summary["gemms"] = gemms
    summary["gemms_interleaved"] = interleaved
    summary["mlp_interleaved"] = mlp_interleaved
    summary["training_interleaved"] = training_interleaved
    summary["gemm_kernels"] = gemm_kernels
    with open(os.path.join(args.directory, "compare.json"), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
