"""`python tests/run_grow.py RUN_DIR/config.json [...] [--run-dir DIR] [--stop-after-step N]`: (re)start or
resume the runs stored in those folders (several in lockstep, grow.train_together) in a process of its own, as
one process or as each torchrun rank: what the resume, lockstep and launch tests start, kill and restart."""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the kit's root, from any working directory

import torch.distributed as dist

from config import RunConfig
from grow import train_together
from plumbing.checkpoint import loads


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("configs", type=Path, nargs="+", help="runs' config.json files")
    parser.add_argument("--run-dir", type=Path, help="one run only; default: the folder holding its config")
    parser.add_argument("--stop-after-step", type=int, help="stop there, as if killed (resume tests)")
    args = parser.parse_args(argv)
    if args.run_dir and len(args.configs) > 1:
        parser.error("--run-dir is for one run; each of several runs lives in its config's folder")
    jobs = [(RunConfig(**loads(path.read_text())), args.run_dir or path.parent) for path in args.configs]
    train_together(jobs, stop_after_step=args.stop_after_step)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
