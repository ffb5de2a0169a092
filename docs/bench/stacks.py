"""Summarise py-spy's collapsed stacks (`--format raw`): per thread, the samples whose leaf
(self) or any frame (inclusive) is each function, top N.

    python3 docs/bench/stacks.py FILE [--top 25] [--thread NAME]
"""

from __future__ import annotations

import argparse
import collections
import re


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--thread", help="only threads whose name contains this")
    args = parser.parse_args()
    per_thread: dict[str, list[tuple[list[str], int]]] = collections.defaultdict(list)
    for line in open(args.file):
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        thread = frames[0]
        if args.thread and args.thread not in thread:
            continue
        clean = [re.sub(r" \(.*?:\d+\)$", "", f) for f in frames[1:]]
        per_thread[thread].append((clean, int(count)))
    for thread, stacks in sorted(per_thread.items(), key=lambda kv: -sum(c for _, c in kv[1])):
        total = sum(c for _, c in stacks)
        print(f"\n== {thread}: {total} samples")
        leaf: collections.Counter[str] = collections.Counter()
        incl: collections.Counter[str] = collections.Counter()
        for frames, count in stacks:
            if frames:
                leaf[frames[-1]] += count
            for f in set(frames):
                incl[f] += count
        print("  self:")
        for f, c in leaf.most_common(args.top):
            print(f"    {100 * c / total:5.1f}%  {f}")
        print("  inclusive:")
        for f, c in incl.most_common(args.top):
            print(f"    {100 * c / total:5.1f}%  {f}")


if __name__ == "__main__":
    main()
