"""nanoGPT's own train.py beside `python -m mpi_train` on one GPU: the same shape, precision and compile, tokens/s
side by side, for docs/results.md.

    python scripts/nanogpt_side_by_side.py prepare TEXT...     # where the data is made: a char-level data set
    python scripts/nanogpt_side_by_side.py [--iters 150]       # on the GPU machine (--dry: tiny, on CPUs)

nanoGPT is not part of this project: its train.py, model.py and configurator.py (github.com/karpathy/nanoGPT) are
expected in .gpu/nanogpt/, a folder git ignores, and its data in .gpu/nanogpt/data/shakespeare_char/ (train.bin,
val.bin, meta.pkl), which `prepare` makes from any UTF-8 text as nanoGPT's data/shakespeare_char/prepare.py does
(char-level, the first 90% to train), the text kept to tiny Shakespeare's 65 characters so that nanoGPT's model has
the shape of its shakespeare_char run; tokens/s does not depend on what the text says. Our job reads the same text
(input.txt beside them) as bytes: its vocabulary is the 256 byte values.

Both train the shakespeare_char shape (6 layers, 6 heads, width 384, context 256, batch 64, one micro-batch a step)
with dropout 0 (ours: gpt's default), biases (ours has them: nanoGPT's --bias=True), gradients clipped at 1.0
(nanoGPT's default; ours --clip-grad-norm 1.0), AdamW, bfloat16 autocast and torch.compile, one process on one GPU.
nanoGPT logs an iteration every --log-interval, each logged one waiting for the GPU (loss.item()): its tokens/s here
is the tokens of the iterations between two logged ones over the wall time between their lines, after --skip
iterations (compiling, and its evaluation at iteration 0); its own per-iteration ms (the logged iteration's alone)
is shown beside. Ours is the job's tokens/s after --skip steps, from its summary. Attention differs: nanoGPT calls
F.scaled_dot_product_attention (flash attention), ours writes it out so that the FLOP counter sees its matmuls.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
NANOGPT = ROOT / ".gpu" / "nanogpt"
DATA = NANOGPT / "data" / "shakespeare_char"
NANOGPT_FILES = ("train.py", "model.py", "configurator.py")
# tiny Shakespeare's characters (nanoGPT's shakespeare_char vocabulary, 65 of them)
SHAKESPEARE_CHARS = "\n !$&',-.3:;?" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ" + "abcdefghijklmnopqrstuvwxyz"
ITERATION = re.compile(r"^iter (\d+): loss \S+, time ([\d.]+)ms, mfu (-?[\d.]+)%")


def prepare(texts: list[Path]) -> None:
    """nanoGPT's shakespeare_char data from `texts`: input.txt, train.bin and val.bin (uint16 ids), meta.pkl."""
    text = "".join(path.read_text(encoding="utf-8", errors="ignore") for path in texts).replace("\t", " ")
    text = "".join(char for char in text if char in SHAKESPEARE_CHARS)
    chars = sorted(set(text))
    stoi = {char: index for index, char in enumerate(chars)}
    cut = int(len(text) * 0.9)
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / "input.txt").write_text(text, encoding="utf-8")
    np.array([stoi[c] for c in text[:cut]], dtype=np.uint16).tofile(DATA / "train.bin")
    np.array([stoi[c] for c in text[cut:]], dtype=np.uint16).tofile(DATA / "val.bin")
    with open(DATA / "meta.pkl", "wb") as meta:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, meta)
    print(f"wrote {DATA}: {len(text):,} characters, vocabulary {len(chars)}, train {cut:,}, val {len(text) - cut:,}")


def shape(args: argparse.Namespace) -> dict:
    """The model and batch both train."""
    if args.dry:
        return {"layers": 1, "heads": 2, "width": 32, "context": 32, "batch": 4}
    return {"layers": 6, "heads": 6, "width": 384, "context": 256, "batch": 64}


def nanogpt(args: argparse.Namespace, out: Path) -> dict:
    """nanoGPT's train.py for --iters iterations: its tokens/s between logged iterations after --skip, its own
    per-iteration ms and MFU, and its vocabulary."""
    size = shape(args)
    flags = [f"--dataset={DATA.name}", f"--n_layer={size['layers']}", f"--n_head={size['heads']}",
             f"--n_embd={size['width']}", f"--block_size={size['context']}", f"--batch_size={size['batch']}",
             "--gradient_accumulation_steps=1", "--dropout=0.0", "--bias=True", f"--max_iters={args.iters}",
             "--eval_interval=1000000", "--eval_iters=1", f"--log_interval={args.log_interval}",
             "--always_save_checkpoint=False", "--wandb_log=False", f"--out_dir={out}", "--decay_lr=False",
             *(["--device=cpu", "--dtype=float32", "--compile=False"] if args.dry else
               ["--device=cuda", "--dtype=bfloat16", "--compile=True"])]
    command = [sys.executable, "train.py", *flags]
    print("nanoGPT:", " ".join(command), flush=True)
    logged, lines = [], []
    process = subprocess.Popen(command, cwd=NANOGPT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    stop = threading.Timer(args.limit, process.kill)  # a silent hang ends too: the lines stop coming
    stop.start()
    try:
        for line in process.stdout:
            seen = time.perf_counter()  # the line's arrival: the logged iteration has waited for the GPU
            lines.append(line.rstrip())
            found = ITERATION.match(line)
            if found:
                logged.append((int(found[1]), seen, float(found[2]), float(found[3])))
        process.wait()
    finally:
        stop.cancel()
    if process.returncode != 0 or len(logged) < 2:
        print("\n".join(lines[-20:]))
        raise RuntimeError(f"nanoGPT's train.py ended with exit status {process.returncode}"
                           + (f" (killed after {args.limit:g} s)" if process.returncode == -9 else ""))
    steady = [entry for entry in logged if entry[0] >= args.skip] or logged[-2:]
    (first, began, _, _), (last, ended, _, mfu) = steady[0], steady[-1]
    tokens = size["batch"] * size["context"]
    with open(DATA / "meta.pkl", "rb") as meta:
        vocab = pickle.load(meta)["vocab_size"]
    return {"tokens_per_s": tokens * (last - first) / (ended - began), "iterations": last - first,
            "ms_per_iteration": 1e3 * (ended - began) / (last - first),
            "own_ms_median": statistics.median(entry[2] for entry in steady), "own_mfu": mfu / 100, "vocab": vocab}


def ours(args: argparse.Namespace, out: Path) -> dict:
    """`python -m mpi_train` on the same text, shape, precision and compile: its steady tokens/s and MFU."""
    size = shape(args)
    summary = out / "summary.json"
    command = [sys.executable, "-m", "mpi_train", "--model", "gpt", "--dataset", "text", "--data-dir",
               str(DATA / "input.txt"), "--gpt-layers", str(size["layers"]), "--gpt-heads", str(size["heads"]),
               "--gpt-width", str(size["width"]), "--context", str(size["context"]), "--batch-size",
               str(size["batch"]), "--precision", "bf16-mixed", "--compile", "--clip-grad-norm", "1.0",
               "--max-steps", str(args.iters), "--epochs", "100", "--timing-warmup-steps", str(args.skip),
               "--log-every", str(args.log_interval), "--backend", "gloo" if args.dry else "nccl", "--no-tracking",
               "--summary-json", str(summary)]
    print("ours:", " ".join(command), flush=True)
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=args.limit, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
    if done.returncode != 0:
        print((done.stdout + done.stderr)[-3000:])
        raise RuntimeError(f"python -m mpi_train ended with exit status {done.returncode}")
    data = json.loads(summary.read_text())
    speed = data["throughput"]
    return {"tokens_per_s": speed["tokens_per_s_per_rank"], "mfu": speed.get("mfu"), "dtype": speed["dtype"],
            "device": speed["device_name"], "compile_s": data.get("compile_s"),
            "ms_per_iteration": 1e3 * data["mean_times_after_warmup"]["step_time_s"], "vocab": 256}


def report(args: argparse.Namespace, theirs: dict | None, mine: dict | None) -> str:
    size = shape(args)
    notes = {"nanoGPT train.py": "", "python -m mpi_train": ""}
    if theirs:
        notes["nanoGPT train.py"] = (f"its own log: {theirs['own_ms_median']:.2f} ms a logged iteration, MFU "
                                     f"{100 * theirs['own_mfu']:.1f}% of an A100's bf16 peak (312 TFLOP/s)")
    if mine:
        notes["python -m mpi_train"] = (
            (f"MFU {100 * mine['mfu']:.1f}% of the {mine['dtype']} peak" if mine.get("mfu") is not None
             else "no peak known for this device")
            + (f"; compiled in {mine['compile_s']:.1f} s, apart" if mine.get("compile_s") else ""))
    computing = "a dry run on CPUs (nanoGPT eager in float32)" if args.dry else "bf16 autocast + torch.compile"
    lines = [(f"side by side on {mine['device'] if mine else 'one device'}: gpt {size['layers']} layers, "
              f"{size['heads']} heads, width {size['width']}, context {size['context']}, batch {size['batch']}, "
              f"{computing}, {args.iters} steps, timed after {args.skip}"),
             f"  {'':22}{'tokens/s':>12}{'ms/step':>10}{'vocab':>7}  notes"]
    for (name, note), figures in zip(notes.items(), (theirs, mine)):
        lines.append(f"  {name:22}{figures['tokens_per_s']:>12,.0f}{figures['ms_per_iteration']:>10.2f}"
                     f"{figures['vocab']:>7}  {note}" if figures else f"  {name:22}{'failed':>12}")
    if theirs and mine:
        lines.append(f"  ours / nanoGPT: {mine['tokens_per_s'] / theirs['tokens_per_s']:.2f}x tokens/s (vocabulary "
                     f"{theirs['vocab']} characters against 256 bytes: the output layer is "
                     f"{256 / theirs['vocab']:.1f}x wider in ours)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["prepare"]:
        parser = argparse.ArgumentParser(prog="nanogpt_side_by_side.py prepare")
        parser.add_argument("texts", nargs="+", type=Path, help="UTF-8 text files, one after the other")
        prepare(parser.parse_args(argv[1:]).texts)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=150, help="iterations (steps) of each (default: 150)")
    parser.add_argument("--skip", type=int, default=30, help="the first iterations left out of the rates "
                        "(default: 30)")
    parser.add_argument("--log-interval", type=int, default=10, help="nanoGPT's log_interval (default: 10)")
    parser.add_argument("--limit", type=float, default=75.0, help="seconds each of the two may run (default: 75)")
    parser.add_argument("--dry", action="store_true", help="a tiny model on CPUs, eager: the script's own dry run")
    args = parser.parse_args(argv)
    missing = [str(NANOGPT / name) for name in NANOGPT_FILES if not (NANOGPT / name).exists()]
    missing += [str(DATA / name) for name in ("train.bin", "val.bin", "meta.pkl", "input.txt")
                if not (DATA / name).exists()]
    if missing:
        print(f"missing: {', '.join(missing)}. Put nanoGPT's {', '.join(NANOGPT_FILES)} in {NANOGPT} (from "
              f"github.com/karpathy/nanoGPT) and run `python {Path(__file__).name} prepare TEXT` first.",
              file=sys.stderr)
        return 2
    theirs = mine = None
    with tempfile.TemporaryDirectory(prefix="nanogpt-side-by-side-") as folder:
        for name, run in (("nanoGPT", nanogpt), ("ours", ours)):
            try:
                figures = run(args, Path(folder))
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                print(f"{name}: {error}", flush=True)
                continue
            theirs, mine = (figures, mine) if name == "nanoGPT" else (theirs, figures)
    print(report(args, theirs, mine), flush=True)
    return 0 if theirs and mine else 1


if __name__ == "__main__":
    sys.exit(main())
