"""What the hand-run comparison scripts (check_logits.py, check_tokenizer.py) share: the
project's pinned torch + transformers venv (scripts/python-venv.sh creates it from
bench/peers/requirements.lock, ~6 GB, on first use, and prints its path) and their common
arguments (the engine binary, the model, the texts fetched by scripts/fetch-data.sh)."""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("E8KV_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "e8kv")


def reexec_in_pinned_venv():
    """Re-executes the running script with the venv's Python, unless it already runs there."""
    made = subprocess.run(["bash", os.path.join(ROOT, "scripts", "python-venv.sh")], check=True,
                          stdout=subprocess.PIPE, text=True)
    venv = made.stdout.strip().splitlines()[-1]
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        return
    python = os.path.join(venv, "bin", "python")
    os.execv(python, [python, *sys.argv])


def engine_arguments(description):
    """An argument parser with --bin (the e8kv-llama binary), --model and --text."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="path of the e8kv-llama binary")
    ap.add_argument("--model", default=os.environ.get("E8KV_MODEL") or
                    os.path.join(CACHE, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--text", nargs="*", default=[os.path.join(CACHE, "text", "tech.txt"),
                                                 os.path.join(CACHE, "text", "fiction.txt")])
    return ap
