#!/usr/bin/env python3
"""Run by scripts/setup-venv.sh (docs/python.md, "The venv").

Generate tiny stub .so files for the CUDA libraries that a PyPI (CUDA) torch
wheel links against, so `import torch` works CPU-only without ~2.3 GB of
nvidia-* wheels.  Stubs go to site-packages/nvidia/cu13/lib, which is on the
RPATH of torch's libraries, so no LD_LIBRARY_PATH is needed.
Usage: python mkstubs.py  (run with the venv's python; needs nm + cc)"""
import os, re, subprocess, sys, tempfile, sysconfig, collections

site = sysconfig.get_paths()["purelib"]
tdir = os.path.join(site, "torch")
out = os.path.join(site, "nvidia", "cu13", "lib")
os.makedirs(out, exist_ok=True)

sos = [os.path.join(r, f) for r, _, fs in os.walk(tdir) for f in fs if ".so" in f]

def nm(path, flag):
    r = subprocess.run(["nm", "-D", flag, path], capture_output=True, text=True)
    return [l.split()[-1] for l in r.stdout.splitlines() if l.strip()]

def needed(path):
    r = subprocess.run(["readelf", "-d", path], capture_output=True, text=True)
    return re.findall(r"\(NEEDED\).*\[(.+?)\]", r.stdout)

# sonames to stub: every NEEDED CUDA lib (libcuda.so.1 is dlopen'ed lazily; skip)
cuda_re = re.compile(r"^lib(cu|nccl|nvrtc|nvshmem|nvJitLink)")
sonames = sorted({n for s in sos for n in needed(s) if cuda_re.match(n) and n != "libcuda.so.1"})
vers = {n: n for n in sonames}            # version node name == soname for most
vers["libnvshmem_host.so.3"] = "NVSHMEM"
prefix = [("nccl", "libnccl.so.2"), ("cusparseLt", "libcusparseLt.so.0"),
          ("cuFile", "libcufile.so.0"), ("nvshmem", "libnvshmem_host.so.3")]
defined = {s.split("@")[0] for so in sos for s in nm(so, "--defined-only")}

syms = collections.defaultdict(dict)      # soname -> {sym: version or None}
for so in sos:
    for s in nm(so, "--undefined-only"):
        name, _, ver = s.partition("@")
        ver = ver.lstrip("@")
        if ver:
            for n, v in vers.items():
                if v == ver:
                    syms[n][name] = ver
        elif name not in defined:
            for p, n in prefix:
                if name.startswith(p) and n in sonames:
                    syms[n][name] = None

DATA = {"nvshmem_selected_device_transport"}
SPECIAL = {
    "cudaGetDeviceCount": "int cudaGetDeviceCount(int*c){if(c)*c=0;return 100;}",
    "cudaGetLastError": "int cudaGetLastError(void){return 0;}",
    "cudaPeekAtLastError": "int cudaPeekAtLastError(void){return 0;}",
    "cudaDriverGetVersion": "int cudaDriverGetVersion(int*v){if(v)*v=0;return 0;}",
}
MARK = b"torch_cuda_stub_marker"
for n in sonames:
    dst = os.path.join(out, n)
    if os.path.exists(dst) and MARK not in open(dst, "rb").read():
        print(f"keep real {n}")   # a real nvidia wheel provides it; don't clobber
        continue
    d = syms.get(n, {})
    lines = ["int torch_cuda_stub_marker = 1;"]
    for s in sorted(d):
        if s in SPECIAL:
            lines.append(SPECIAL[s])
        elif s in DATA:
            lines.append(f"int {s}[64];")
        elif re.search(r"Get(Error)?(String|Name)$", s):
            lines.append(f'const char* {s}(){{return "CUDA stub: no CUDA runtime";}}')
        else:
            lines.append(f"long {s}(){{return 100;}}")
    with tempfile.TemporaryDirectory() as td:
        c, m = os.path.join(td, "s.c"), os.path.join(td, "s.map")
        open(c, "w").write("\n".join(lines) + "\n")
        vs = {v for v in d.values() if v}
        with open(m, "w") as f:
            for v in vs:
                names = [s for s, x in d.items() if x == v]
                f.write(v + " {\n global:\n" + "".join(f"  {s};\n" for s in names) + "};\n")
            unv = [s for s, x in d.items() if x is None]
            if unv:   # unversioned names go into a base node
                f.write("STUB_BASE {\n global:\n" + "".join(f"  {s};\n" for s in unv) + " local: *;\n};\n")
        subprocess.run(["cc", "-shared", "-fPIC", "-O0", "-w", "-o", os.path.join(out, n),
                        f"-Wl,-soname,{n}", f"-Wl,--version-script={m}", c], check=True)
    print(f"stub {n}: {len(d)} symbols")
