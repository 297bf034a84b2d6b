#!/usr/bin/env python3
"""Long functions and long files (docs/architecture.md, "Size rules").

    scripts/long-functions.py lib tools examples runtime
        Lists functions of 150 lines or more under the folders, longest
        first: LINES FILE LINE NAME, and "(reason)" after those that carry a
        "// Long because: ..." comment.

    scripts/long-functions.py --check lib include tools ...
        The structure rule (ctest structure.sizes): prints each source file
        over 1,500 lines and each function over 200 lines without a
        "// Long because:" comment, as FILE:LINE: what, and exits 1 if there
        is any. Test folders (test, tests, unittests), fuzz corpora and build
        trees are skipped.

Finding functions is a brace-matching heuristic, not a parser: comments and
string literals are blanked, then a '{' that follows ')' (and not
if/for/while/switch/catch) at the outermost function level opens a function;
LINES counts from the line of that '{' to the line of its '}'. LINE is the
line of the '{' and NAME a guess from the text before it.

A reason counts when a comment line containing "Long because:" belongs to the
comment block right above the function: walking up from the '{' line over the
signature (lines that do not end a statement or block and are not blank),
then over the '//' comment lines directly above it.
"""
import argparse
import os
import re
import sys

FILE_LIMIT = 1500
FUNCTION_LIMIT = 200
CXX = ('.cpp', '.h', '.cu', '.cuh', '.c')
SOURCES = CXX + ('.py', '.td')
SKIP_DIRS = {'test', 'tests', 'unittests', 'corpus', '.venv', '__pycache__',
             '.git'}
REASON = 'Long because:'


def strip(src):
    """The source with comments and string literals blanked (lines kept)."""
    out = []
    i = 0
    n = len(src)
    while i < n:
        c = src[i]
        if src.startswith('//', i):
            j = src.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i))
            i = j
        elif src.startswith('/*', i):
            j = src.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', src[i:j]))
            i = j
        elif c == '"' or c == "'":
            if c == '"' and i > 0 and src[i - 1] == 'R':
                m = re.match(r'R"([^(]*)\(', src[i - 1:])
                d = m.group(1)
                end = src.find(')' + d + '"', i)
                j = end + len(d) + 2
            else:
                j = i + 1
                while j < n and src[j] != c:
                    j += 2 if src[j] == '\\' else 1
                j += 1
            out.append(c + re.sub(r'[^\n]', ' ', src[i + 1:j - 1]) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def name_before(s, brace):
    """The function's name: the identifier before the '(' that matches the
    last ')' ahead of its body's '{'."""
    close = s.rfind(')', 0, brace)
    depth = 0
    for i in range(close, -1, -1):
        if s[i] == ')':
            depth += 1
        elif s[i] == '(':
            depth -= 1
            if depth == 0:
                m = re.search(r'([\w:~]+|operator\S+)\s*$', s[max(0, i - 200):i])
                return m.group(1) if m else '?'
    return '?'


def functions(path):
    """(lines, first line, name) of each outermost function body of 150
    lines or more in the file."""
    s = strip(open(path, errors='replace').read())
    found = []
    stack = []
    for m in re.finditer(r'[{}]', s):
        if m.group() == '{':
            pre = s[max(0, m.start() - 300):m.start()].rstrip()
            isfn = bool(re.search(
                r'\)\s*(const|override|noexcept|final|mutable|\s|->\s*[\w:<>,\s\*&]+)*$',
                pre)) and not re.search(
                    r'\b(if|for|while|switch|catch)\s*\([^;{}]*\)\s*$', pre)
            stack.append((m.start(), isfn))
        else:
            if not stack:
                continue
            st, isfn = stack.pop()
            if isfn and not any(x[1] for x in stack):
                a = s.count('\n', 0, st) + 1
                b = s.count('\n', 0, m.start()) + 1
                if b - a >= 150:
                    found.append((b - a, a, name_before(s, st)))
    return found


def has_reason(lines, brace_line):
    """Whether the comment block right above the function whose body opens
    on `brace_line` (1-based) says why it is long."""
    i = brace_line - 1  # 0-based index of the '{' line
    # The signature: up over lines that are not blank, not comments, and do
    # not end the statement or block before it.
    while i > 0:
        above = lines[i - 1].strip()
        if not above or above.startswith('//') or above.endswith(
                (';', '}', '{')) or above.startswith('#'):
            break
        i -= 1
    # The comment lines directly above the signature.
    while i > 0 and lines[i - 1].strip().startswith('//'):
        if REASON in lines[i - 1]:
            return True
        i -= 1
    return False


def walk(roots, suffixes):
    for root in roots:
        for dp, dn, fn in os.walk(root):
            dn[:] = sorted(d for d in dn
                           if d not in SKIP_DIRS and not d.startswith('build'))
            for f in sorted(fn):
                if f.endswith(suffixes):
                    yield os.path.join(dp, f)


def read_pending(path):
    """{(file, function)} of a pending list: one "FILE FUNCTION" a line,
    '#' comments."""
    pending = set()
    for line in open(path):
        line = line.split('#', 1)[0].split()
        if line:
            pending.add((line[0], line[1]))
    return pending


def check(roots, pending=frozenset(), pending_path=None):
    problems = []
    seen = set()
    for p in walk(roots, SOURCES):
        lines = open(p, errors='replace').read().split('\n')
        count = len(lines) - (1 if lines and lines[-1] == '' else 0)
        if count > FILE_LIMIT:
            problems.append('%s:1: %d lines, over the %d-line limit for a '
                            'source file' % (p, count, FILE_LIMIT))
        if not p.endswith(CXX):
            continue
        for length, line, name in functions(p):
            if length <= FUNCTION_LIMIT or has_reason(lines, line):
                continue
            if (os.path.normpath(p), name) in pending:
                seen.add((os.path.normpath(p), name))
                print('%s:%d: %s is %d lines (pending: %s)' %
                      (p, line, name, length, pending_path))
            else:
                problems.append(
                    '%s:%d: %s is %d lines, over %d, with no "// %s" '
                    'comment above it' % (p, line, name, length,
                                          FUNCTION_LIMIT, REASON))
    for f, name in sorted(set(pending) - seen):
        problems.append('%s: %s %s is no longer a function over %d lines '
                        'without a reason; remove it from the list' %
                        (pending_path, f, name, FUNCTION_LIMIT))
    for line in problems:
        print(line)
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--check', action='store_true',
                    help='print what breaks the size rules; exit 1 if any')
    ap.add_argument('--pending', metavar='FILE',
                    help='with --check: "FILE FUNCTION" lines of long '
                    'functions whose split is under way elsewhere; each '
                    'is reported, not failed, and fails once it is no '
                    'longer long (so the list cannot go stale)')
    ap.add_argument('folders', nargs='+')
    args = ap.parse_args()
    for f in args.folders:
        if not os.path.isdir(f):
            print('long-functions: %s: no such folder' % f, file=sys.stderr)
            return 2
    if args.check:
        pending = read_pending(args.pending) if args.pending else set()
        return 1 if check(args.folders, pending, args.pending) else 0
    res = []
    for p in walk(args.folders, CXX):
        lines = open(p, errors='replace').read().split('\n')
        for length, line, name in functions(p):
            res.append((length, p, line, name,
                        '(reason)' if has_reason(lines, line) else ''))
    for r in sorted(res, reverse=True):
        print(*[x for x in r if x != ''])
    return 0


if __name__ == '__main__':
    sys.exit(main())
