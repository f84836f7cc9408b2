#!/usr/bin/env python3
# doxygen_filter.py FILE: prints a header as Doxygen should read it. The
# headers keep the project's plain // comments (they are written for a reader
# of the header first); this filter, Doxygen's INPUT_FILTER, reads them as
# documentation: the opening block documents the file, a comment line before
# a declaration documents it, and a trailing comment after a member (`;` or
# `,`) documents that member. Line numbers are kept, so warnings point at the
# header's own lines.
import re
import sys

line_comment = re.compile(r'^(\s*)//(?!/)(.*)$')
std_specialization = re.compile(r'^(struct|class) std::\S+.*\};$')
trailing_comment = re.compile(r'^(.*[;,])(\s+)//(?!/)(.*)$')


def code_is_plain(code):
    # The // is a comment, not inside a string such as "postgresql://".
    return code.count('"') % 2 == 0 and '//' not in code


def documented_name(path):
    # \file takes the file's name first: pgmutex/... as the headers are included.
    return path[path.rindex('/include/') + len('/include/'):] if '/include/' in path else path


def main(path):
    with open(path, encoding='utf-8') as f:
        lines = f.read().split('\n')
    out = []
    i = 0
    if lines and lines[0].startswith('//'):
        out.append('/// \\file ' + documented_name(path) + lines[0][2:])
        i = 1
        while i < len(lines) and lines[i].startswith('//'):
            out.append('///' + lines[i][2:])
            i += 1
    rest = lines[i:]
    for n, line in enumerate(rest):
        # A specialization in std (std::is_error_code_enum<Errc>) is not API,
        # and Doxygen cannot place it: left out.
        if line == 'template <>' and n + 1 < len(rest) and std_specialization.match(rest[n + 1]):
            out.append('/** \\cond */ ' + line)
            continue
        if std_specialization.match(line) and n > 0 and rest[n - 1] == 'template <>':
            out.append(line + ' /** \\endcond */')
            continue
        m = line_comment.match(line)
        if m:
            out.append(m.group(1) + '///' + m.group(2))
            continue
        m = trailing_comment.match(line)
        if m and code_is_plain(m.group(1)):
            out.append(m.group(1) + m.group(2) + '///<' + m.group(3))
            continue
        out.append(line)
    sys.stdout.write('\n'.join(out))


if __name__ == '__main__':
    main(sys.argv[1])
