#!/usr/bin/env python3
"""No include cycle between components (docs/architecture.md, "Size rules").

    scripts/check-include-cycles.py SOURCE_DIR FOLDER...

A component is a header and its implementation: the files of one folder
with one name but the extension (RunCommand.h, RunCommand.cpp). A
component depends on another when one of its files has a quoted #include of
one of the other's files, resolved against the including file's folder,
then SOURCE_DIR/include and SOURCE_DIR/runtime/include, then as the only
file under the folders whose path ends with the included path (a tool's
include directories); includes that resolve to nothing here (generated
files, other projects) are left out. Each cycle of dependencies is printed
as "A -> B -> A", and the exit status is 1 if there is any. So a.cpp
including b.h while b.cpp includes a.h is a cycle, as a.h and b.h including
each other is.
"""
import os
import re
import sys

SUFFIXES = ('.h', '.hpp', '.cpp', '.cc', '.c', '.cu', '.cuh', '.inc')
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def component(path):
    """The component of a file: its path without the extension. A public
    header (include/meshplan/...) is a component of its own, apart from its
    implementation in lib/, whose private headers (lib/Plan/PlanRead.h)
    include it and are included by the implementation."""
    return os.path.splitext(path)[0]


def main():
    if len(sys.argv) < 3:
        print(__doc__.split('\n\n')[1], file=sys.stderr)
        return 2
    root = sys.argv[1]
    files = []
    for folder in sys.argv[2:]:
        top = os.path.join(root, folder)
        if not os.path.isdir(top):
            print('check-include-cycles: %s: no such folder' % folder,
                  file=sys.stderr)
            return 2
        for dp, dn, fn in os.walk(top):
            dn[:] = sorted(d for d in dn if not d.startswith(('build', '.')))
            for f in sorted(fn):
                if f.endswith(SUFFIXES):
                    files.append(os.path.relpath(os.path.join(dp, f), root))
    known = set(files)
    by_suffix = {}
    for f in files:
        parts = f.split('/')
        for k in range(1, len(parts) + 1):
            by_suffix.setdefault('/'.join(parts[-k:]), []).append(f)

    def resolve(including, name):
        for base in (os.path.dirname(including), 'include', 'runtime/include'):
            cand = os.path.normpath(os.path.join(base, name))
            if cand in known:
                return cand
        hits = by_suffix.get(os.path.normpath(name), [])
        return hits[0] if len(hits) == 1 else None

    deps = {}
    for f in files:
        text = open(os.path.join(root, f), errors='replace').read()
        src = component(f)
        deps.setdefault(src, set())
        for name in INCLUDE.findall(text):
            target = resolve(f, name)
            if target and component(target) != src:
                deps[src].add(component(target))

    # Tarjan's strongly connected components, iteratively.
    index, low, on, stack, sccs = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(deps):
        if start in index:
            continue
        work = [(start, iter(sorted(deps[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(deps.get(nxt, ())))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                scc = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    scc.append(x)
                    if x == node:
                        break
                if len(scc) > 1:
                    sccs.append(sorted(scc))

    for scc in sccs:
        # One cycle through the component's first member, by breadth-first
        # search inside the component.
        members = set(scc)
        first = scc[0]
        prev = {first: None}
        queue = [first]
        cycle = None
        while queue and cycle is None:
            node = queue.pop(0)
            for nxt in sorted(deps[node]):
                if nxt == first:
                    path = [node]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    cycle = list(reversed(path)) + [first]
                    break
                if nxt in members and nxt not in prev:
                    prev[nxt] = node
                    queue.append(nxt)
        print('include cycle: ' + ' -> '.join(cycle) +
              ('' if len(scc) == len(cycle) - 1 else
               ' (%d components in the cycle\'s knot: %s)' %
               (len(scc), ', '.join(scc))))
    if sccs:
        return 1
    print('check-include-cycles: %d components under %s, no include cycle' %
          (len(deps), ' '.join(sys.argv[2:])))
    return 0


if __name__ == '__main__':
    sys.exit(main())
