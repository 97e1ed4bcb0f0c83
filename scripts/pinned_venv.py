"""The project's pinned torch + transformers venv for Python scripts run by hand
(check_logits.py, check_tokenizer.py): scripts/python-venv.sh creates it from
bench/peers/requirements.lock (~6 GB, on first use) and prints its path."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def reexec_in_pinned_venv():
    """Re-executes the running script with the venv's Python, unless it already runs there."""
    made = subprocess.run(["bash", os.path.join(ROOT, "scripts", "python-venv.sh")], check=True,
                          stdout=subprocess.PIPE, text=True)
    venv = made.stdout.strip().splitlines()[-1]
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        return
    python = os.path.join(venv, "bin", "python")
    os.execv(python, [python, *sys.argv])
