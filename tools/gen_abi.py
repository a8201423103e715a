#!/usr/bin/env python3
"""Generate the bindings of the C ABI from its headers, so that coda.h is the one source of the
ABI's structs, constants and signatures:

  python/coda/_abi.py      the ctypes Structures, the constants and every function's signature
  src/api/abi_layout.inc   X-macro lines: one per struct and per field, from which
                           src/api/abi_cast.hpp static_asserts that each C++ twin (coda::GemmArgs,
                           coda::llama::Config, ...) is layout-identical to its C struct; one per
                           kernel entry point, which src/api/c_abi.cpp defines from them

  tools/gen_abi.py           rewrite both files
  tools/gen_abi.py --check   exit 1 (saying which file and how to fix it) when either is stale

Pure standard library. It reads include/coda/coda.h and the coda headers it includes, written in
a restricted style, and stops with an error on anything outside it:
  * `#define CODA_NAME <integer or string literal>` -> a constant NAME;
  * `typedef enum name { CODA_A = 0, ... } name;` with every value explicit -> constants A, ...;
  * `typedef struct name { <type> a, b; <type> c[CODA_MAX_RANK]; ... } name;` where a type is
    int32_t, int64_t, float, void* or a struct defined before;
  * `CODA_API <coda_status | const char*> name(<params> | void);` -> a signature;
  * `typedef struct X* coda_stream_t;` (a pointer) and `static inline` helpers (not bound).

Names: a struct `coda_x_y` is the Python class `XY` and the C++ type `coda::XY`; `coda_llama_x_y` is
`LlamaXY` and `coda::llama::XY`; `coda_tensor` alone is `Tensor` / `coda::TensorView`.
"""

import argparse
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
INCLUDE = os.path.join(ROOT, "include")
MAIN_HEADER = "coda/coda.h"
PY_OUT = os.path.join(ROOT, "python", "coda", "_abi.py")
CPP_OUT = os.path.join(ROOT, "src", "api", "abi_layout.inc")

SCALARS = {"int32_t": "c_int32", "int64_t": "c_int64", "float": "c_float", "void*": "c_void_p",
           "size_t": "c_size_t"}
SPECIAL = {"coda_tensor": ("Tensor", "coda::TensorView")}


class HeaderError(Exception):
    pass


def names_of(c_name):
    """(Python class, C++ type) of the C struct `c_name`."""
    if c_name in SPECIAL:
        return SPECIAL[c_name]
    if not c_name.startswith("coda_"):
        raise HeaderError("%s: C ABI structs are named coda_*" % c_name)
    words = c_name[len("coda_"):].split("_")
    namespace = "coda::"
    prefix = ""
    if words[0] == "llama":
        namespace, prefix, words = "coda::llama::", "Llama", words[1:]
    camel = "".join(w.capitalize() for w in words)
    return prefix + camel, namespace + camel


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def header_order(name, seen=None):
    """`name` and the coda headers it includes, each after the headers it includes."""
    seen = [] if seen is None else seen
    text = open(os.path.join(INCLUDE, name)).read()
    for inc in re.findall(r'^\s*#\s*include\s+"(coda/[^"]+)"', text, re.M):
        if inc not in seen:
            header_order(inc, seen)
    if name not in seen:
        seen.append(name)
    return seen


def drop_inline_functions(code):
    """Remove `static inline ... { ... }` definitions (helpers, not part of the binding)."""
    out, i = [], 0
    for m in re.finditer(r"\bstatic\s+inline\b", code):
        if m.start() < i:
            continue
        out.append(code[i:m.start()])
        j = code.index("{", m.end())
        depth = 0
        for k in range(j, len(code)):
            depth += {"{": 1, "}": -1}.get(code[k], 0)
            if depth == 0:
                break
        i = k + 1
    out.append(code[i:])
    return "".join(out)


class Abi:
    def __init__(self):
        self.constants = []  # (name, python literal, header)
        self.structs = []  # (c name, [(field, c type, array length or None)], header)
        self.functions = []  # (c name, return c type, [(c type, pointer?)], header)

    def struct_names(self):
        return [s[0] for s in self.structs]


def parse_type(decl, where):
    """'const coda_tensor* x' -> ('coda_tensor', True); 'int64_t m' -> ('int64_t', False)."""
    m = re.match(r"^(?:const\s+)?(\w+)\s*(\*?)\s*(\w+)?$", decl.strip())
    if not m:
        raise HeaderError("%s: cannot read the declaration %r" % (where, decl.strip()))
    return m.group(1), bool(m.group(2))


def parse(headers=None):
    abi = Abi()
    known_structs = set()
    for name in headers or header_order(MAIN_HEADER):
        raw = open(os.path.join(INCLUDE, name)).read()
        code = strip_comments(raw)
        for m in re.finditer(r"^\s*#\s*define\s+CODA_(\w+)[ \t]+(.+?)\s*$", code, re.M):
            value = m.group(2)
            if re.fullmatch(r"-?\d+", value) or re.fullmatch(r'"[^"\\]*"', value):
                abi.constants.append((m.group(1), value, name))
        code = re.sub(r"^\s*#[^\n]*", " ", code, flags=re.M)
        code = drop_inline_functions(code)
        typedefs = 0
        for m in re.finditer(r"\btypedef\b(.*?);", code, re.S):
            typedefs += 1
            body = m.group(1)
            em = re.fullmatch(r"\s*enum\s+(\w+)\s*\{(.*)\}\s*(\w+)\s*", body, re.S)
            sm = re.fullmatch(r"\s*struct\s+(\w+)\s*\{(.*)", body, re.S)
            pm = re.fullmatch(r"\s*struct\s+\w+\s*\*\s*(\w+)\s*", body, re.S)
            if em:
                for item in em.group(2).split(","):
                    im = re.fullmatch(r"\s*CODA_(\w+)\s*=\s*(-?\d+)\s*", item)
                    if not im:
                        raise HeaderError("%s: enum %s: every value is `CODA_NAME = <integer>`; "
                                          "got %r" % (name, em.group(1), item.strip()))
                    abi.constants.append((im.group(1), im.group(2), name))
            elif pm:
                pass  # an opaque pointer (coda_stream_t): bound as c_void_p
            elif not sm:
                raise HeaderError("%s: unsupported typedef %r" % (name, " ".join(body.split())))
        for m in re.finditer(r"\btypedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", code, re.S):
            c_name, body, alias = m.groups()
            if alias != c_name:
                raise HeaderError("%s: typedef struct %s {...} %s: use one name" % (name, c_name,
                                                                                    alias))
            fields = []
            for decl in body.split(";"):
                decl = " ".join(decl.split())
                if not decl:
                    continue
                dm = re.fullmatch(r"(\w+\s*\*?)\s*(.+)", decl)
                ctype = dm.group(1).replace(" ", "")
                for part in dm.group(2).split(","):
                    am = re.fullmatch(r"\s*(\w+)\s*(?:\[(\w+)\])?\s*", part)
                    if not am:
                        raise HeaderError("%s: %s: cannot read the field %r" % (name, c_name, part))
                    if ctype not in SCALARS and ctype not in known_structs:
                        raise HeaderError("%s: %s.%s: type %s is neither %s nor a struct defined "
                                          "before" % (name, c_name, am.group(1), ctype,
                                                      ", ".join(sorted(SCALARS))))
                    fields.append((am.group(1), ctype, am.group(2)))
            known_structs.add(c_name)
            abi.structs.append((c_name, fields, name))
        found = 0
        for m in re.finditer(r"\bCODA_API\s+(.*?)\b(coda_\w+)\s*\((.*?)\)\s*;", code, re.S):
            found += 1
            ret = " ".join(m.group(1).split())
            if ret not in ("coda_status", "const char*"):
                raise HeaderError("%s: %s returns %r; the ABI returns coda_status (or const char* "
                                  "for messages)" % (name, m.group(2), ret))
            params = []
            plist = " ".join(m.group(3).split())
            if plist != "void":
                for decl in plist.split(","):
                    ctype, pointer = parse_type(decl, "%s: %s" % (name, m.group(2)))
                    if ctype not in SCALARS and ctype not in known_structs and ctype != "coda_stream_t":
                        raise HeaderError("%s: %s: parameter type %s is not bound" %
                                          (name, m.group(2), ctype))
                    params.append((ctype, pointer))
            abi.functions.append((m.group(2), ret, params, name))
        if found != len(re.findall(r"\bCODA_API\b", code)):
            raise HeaderError("%s: a CODA_API declaration is not `CODA_API <ret> name(...);`" % name)
    return abi


# ---- output


BANNER = "generated by tools/gen_abi.py from include/%s; do not edit (run tools/gen_abi.py)"


def py_type(ctype, pointer=False):
    if ctype == "coda_stream_t":
        base = "c_void_p"
    elif ctype in SCALARS:
        base = SCALARS[ctype]
    else:
        base = names_of(ctype)[0]
    return "POINTER(%s)" % base if pointer else base


def wrap(head, items, tail, indent=8, width=99):
    """`head` + items joined by ", " + `tail`, broken after a comma before `width` columns."""
    lines, line = [], head
    for i, item in enumerate(items):
        piece = item + (", " if i + 1 < len(items) else "")
        if len(line) + len(piece.rstrip()) > width and line.strip():
            lines.append(line.rstrip())
            line = " " * indent
        line += piece
    lines.append(line + tail)
    return lines


def render_python(abi):
    out = ['"""The C ABI as ctypes, %s.' % (BANNER % MAIN_HEADER).replace("; do", ";\ndo"),
           "",
           "Constants (CODA_ prefix dropped), one Structure per C struct (STRUCTS, by C name), every",
           "function's (restype, argtypes) (SIGNATURES) and the kernels that take one argument struct",
           'and a stream (KERNELS). coda._lib loads the library and wraps the calls."""',
           "",
           "from ctypes import POINTER, Structure, c_char_p, c_float, c_int32, c_int64, c_size_t, "
           "c_void_p",
           ""]
    header = None
    for cname, value, hdr in abi.constants:
        if hdr != header:
            out += ["", "# %s" % hdr]
            header = hdr
        out.append("%s = %s" % (cname, value))
    out += ["", ""]
    for cname, fields, hdr in abi.structs:
        py, cpp = names_of(cname)
        items = []
        for field, ctype, length in fields:
            t = py_type(ctype)
            if length is not None:
                t = "%s * %s" % (t, length[len("CODA_"):] if length.startswith("CODA_") else length)
            items.append('("%s", %s)' % (field, t))
        out += ["class %s(Structure):  # %s, C++ %s" % (py, cname, cpp)]
        out += wrap("    _fields_ = [", items, "]") + ["", ""]
    out += wrap("STRUCTS = {", ['"%s": %s' % (c, names_of(c)[0]) for c in abi.struct_names()],
                "}", indent=4)
    out += ["", "SIGNATURES = {"]
    for fname, ret, params, hdr in abi.functions:
        restype = "c_char_p" if ret == "const char*" else "c_int32"
        out += wrap('    "%s": (%s, [' % (fname, restype), [py_type(t, p) for t, p in params],
                    "]),")
    out.append("}")
    kernels = kernels_of(abi)
    out += [""] + wrap("KERNELS = {", ['"%s": %s' % (f, names_of(s)[0]) for f, s in kernels], "}",
                       indent=4)
    return "\n".join(out) + "\n"


def kernels_of(abi):
    """The functions that take one argument struct and a stream: [(name, C struct)]."""
    return [(f, p[0][0]) for f, ret, p, _ in abi.functions
            if len(p) == 2 and p[0][1] and p[0][0] in abi.struct_names()
            and p[1] == ("coda_stream_t", False) and p[0][0] != "coda_tensor"]


def render_cpp(abi):
    out = ["// %s." % (BANNER % MAIN_HEADER),
           "// X-macro lists; each section is read where its macro is defined:",
           "//   CODA_ABI_STRUCT(C struct, C++ twin) and CODA_ABI_FIELD(C struct, C++ twin, field):",
           "//     src/api/abi_cast.hpp (the layout assertions);",
           "//   CODA_ABI_KERNEL(C function, C argument struct, C++ function), for the functions that take one",
           "//     argument struct and a stream (the C++ one is named alike, without coda_):",
           "//     src/api/c_abi.cpp (their entry points).",
           "#ifdef CODA_ABI_STRUCT"]
    for cname, _, _ in abi.structs:
        out.append("CODA_ABI_STRUCT(%s, %s)" % (cname, names_of(cname)[1]))
    out += ["#endif", "#ifdef CODA_ABI_FIELD"]
    for cname, fields, _ in abi.structs:
        for field, _, _ in fields:
            out.append("CODA_ABI_FIELD(%s, %s, %s)" % (cname, names_of(cname)[1], field))
    out += ["#endif", "#ifdef CODA_ABI_KERNEL"]
    for fname, sname in kernels_of(abi):
        out.append("CODA_ABI_KERNEL(%s, %s, coda::%s)" % (fname, sname, fname[len("coda_"):]))
    out.append("#endif")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="fail when a generated file differs from what the headers give")
    args = ap.parse_args(argv)
    try:
        abi = parse()
    except HeaderError as e:
        print("gen_abi.py: %s" % e, file=sys.stderr)
        return 2
    stale = []
    for path, text in ((PY_OUT, render_python(abi)), (CPP_OUT, render_cpp(abi))):
        old = open(path).read() if os.path.exists(path) else None
        if old == text:
            continue
        if args.check:
            stale.append(os.path.relpath(path, ROOT))
        else:
            with open(path, "w") as f:
                f.write(text)
            print("wrote %s" % os.path.relpath(path, ROOT))
    if stale:
        print("gen_abi.py --check: %s stale: not what the C headers give (a header changed, or "
              "the file was edited). Run tools/gen_abi.py and commit the result."
              % " and ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
