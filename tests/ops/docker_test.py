"""deploy/docker/Dockerfile (every service, CPU) and Dockerfile.cuda (the GPU
workers' image) checked without a container runtime: each builds the Bazel
targets this test gets as data (argv) and copies exactly files those targets
make, including every binary the chart runs; every shared library the copied
binaries need (their ELF NEEDED entries, resolved by this machine's loader)
comes from a package of the final stage's apt-get install, or from one those
depend on, or from Debian 12's base image; Dockerfile.cuda builds with
--config=cuda and installs cudart, cuBLAS (which Loom loads at its first GEMM)
and NCCL of the versions its ARGs name, which agree with the toolkit Bazel
builds against here (/usr/local/cuda) where one is installed.

usage: docker_test.py RUNFILES_ROOT LABEL...
"""
import json
import os
import re
import subprocess
import sys

from ops_testing import check, finish

ROOT, LABELS = sys.argv[1], sys.argv[2:]
CHART_BINARIES = ["loom-scheduler", "loom-preprocess", "loom-encoder-worker", "loom-llm-worker"]
# Packages of the debian:12 image itself (dpkg -l in it), which no apt-get
# install needs to name.
BASE = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g", "libzstd1", "liblzma5", "libbz2-1.0",
        "libgcrypt20", "libgnutls30", "libsystemd0", "libudev1", "libseccomp2", "libxxhash0",
        "liblz4-1", "libcap2", "libcrypt1", "libffi8", "libgmp10", "libidn2-0", "libp11-kit0",
        "libtasn1-6", "libunistring2", "libnettle8", "libhogweed6", "libgpg-error0", "libpcre2-8-0",
        "libselinux1", "libtinfo6", "libuuid1", "libblkid1", "libmount1", "libacl1", "libattr1",
        "libaudit1", "libcap-ng0", "libdb5.3", "libmd0", "libpam0g", "libtirpc3", "libnsl2"}


def instructions(path):
    """(keyword, text) per instruction, continuation lines joined, comments dropped."""
    out, cur = [], ""
    for line in open(path).read().splitlines():
        if line.lstrip().startswith("#"):
            continue
        cur += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            if cur.strip():
                word, _, rest = cur.strip().partition(" ")
                out.append((word.upper(), rest))
            cur = ""
    return out


def final_stage(insts):
    starts = [i for i, (w, _) in enumerate(insts) if w == "FROM"]
    return insts[starts[-1]:]


def args(insts):
    """ARG defaults."""
    vals = {}
    for w, rest in insts:
        if w == "ARG" and "=" in rest:
            k, v = rest.split("=", 1)
            vals[k.strip()] = v.strip()
    return vals


def expand(text, vals):
    """$VAR and ${VAR} from ARGs; $CUDA_PKG as the RUN lines compute it."""
    vals = dict(vals)
    if "CUDA_VERSION" in vals:
        vals["CUDA_PKG"] = vals["CUDA_VERSION"].replace(".", "-")
    return re.sub(r"\$\{?([A-Z_]+)\}?", lambda m: vals.get(m.group(1), m.group(0)), text)


def installed(stage, vals):
    """Packages of the stage's apt-get install lines (name, version or None)."""
    pkgs = {}
    for w, rest in stage:
        if w != "RUN":
            continue
        for cmd in expand(rest, vals).split("&&"):
            words = cmd.split()
            if words[:2] != ["apt-get", "install"]:
                continue
            for p in words[2:]:
                if p.startswith("-"):
                    continue
                name, _, version = p.partition("=")
                pkgs[name] = version or None
    return pkgs


def dpkg_depends_closure(names):
    """Installed packages reachable from `names` through Depends and
    Pre-Depends (the first alternative of each), from one dpkg-query."""
    deps = {}
    r = subprocess.run(["dpkg-query", "-W", "-f=${Package}\t${Depends}, ${Pre-Depends}\n"],
                       capture_output=True, text=True)
    for line in r.stdout.splitlines():
        pkg, _, rest = line.partition("\t")
        names_of = [alt.split("|")[0].strip().split(" ")[0].split(":")[0] for alt in rest.split(",")]
        deps.setdefault(pkg, set()).update(n for n in names_of if n)
    seen, todo = set(), list(names)
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo.extend(deps.get(p, ()))
    return seen


def needed(path):
    r = subprocess.run(["readelf", "-d", path], capture_output=True, text=True)
    if r.returncode != 0:
        return None  # not an ELF file
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", r.stdout)


def library_owners():
    """Shared-library path -> package, from dpkg's file lists (one pass;
    dpkg-query -S per library takes minutes)."""
    owners = {}
    info = "/var/lib/dpkg/info"
    for f in os.listdir(info):
        if not f.endswith(".list"):
            continue
        pkg = f[:-5].split(":")[0]
        for line in open(os.path.join(info, f), errors="replace"):
            if ".so" in line:
                owners[line.strip()] = pkg
    return owners


def package_of(soname, loader, owners):
    path = loader.get(soname)
    if path is None:
        return None, "not found by the loader (ldconfig -p)"
    real = os.path.realpath(path)
    for p in (path, real, "/usr" + path, "/usr" + real):
        if p in owners:
            return owners[p], path
    return None, "%s belongs to no package" % path


def main():
    loader = {}
    for line in subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout.splitlines():
        m = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
        if m and "x86-64" in m.group(2) and m.group(1) not in loader:
            loader[m.group(1)] = m.group(3)
    files = library_owners()
    owners = {}  # soname -> (package, where)
    for name, cuda in (("Dockerfile", False), ("Dockerfile.cuda", True)):
        insts = instructions(os.path.join(ROOT, "deploy/docker", name))
        vals = args(insts)
        build = [expand(r, vals) for w, r in insts if w == "RUN" and "bazel build" in r]
        check(len(build) == 1, "%s: one bazel build" % name)
        if not build:
            continue
        cmd = build[0].split("bazel build", 1)[1].split("&&")[0].split()
        targets = [t for t in cmd if t.startswith("//")]
        check(sorted(targets) == sorted(LABELS),
              "%s: builds %s (the targets this test checks)" % (name, targets))
        check(("--config=cuda" in cmd) == cuda and "-c" in cmd and cmd[cmd.index("-c") + 1] == "opt",
              "%s: -c opt%s" % (name, " --config=cuda" if cuda else ", without CUDA"))
        copied = re.findall(r"bazel-bin/(\S+)", build[0])
        missing = [p for p in copied if not os.path.exists(os.path.join(ROOT, p))]
        check(copied and not missing, "%s: copies %d files, each made by those targets%s" % (
            name, len(copied), "" if not missing else " (not made: %s)" % missing))
        names = {os.path.basename(p) for p in copied}
        check(all(b in names for b in CHART_BINARIES + ["loomctl"]),
              "%s: holds every binary the chart runs and loomctl" % name)
        final = final_stage(insts)
        check(any(w == "COPY" and "--from=build /out/ /usr/local/bin/" in r for w, r in final),
              "%s: the binaries land in /usr/local/bin (the chart's commands)" % name)
        pkgs = installed(final, vals)
        closure = dpkg_depends_closure(list(pkgs) + sorted(BASE)) | BASE
        unmet = []
        for p in copied:
            for soname in needed(os.path.join(ROOT, p)) or []:
                if soname not in owners:
                    owners[soname] = package_of(soname, loader, files)
                pkg, where = owners[soname]
                if pkg is None or pkg not in closure:
                    unmet.append("%s needs %s (%s)" % (os.path.basename(p), soname, pkg or where))
        check(not unmet, "%s: every library the binaries need is installed%s" % (
            name, "" if not unmet else ": " + "; ".join(sorted(set(unmet)))))
        if not cuda:
            check(not any(p.startswith(("cuda-", "libcublas", "libnccl")) for p in pkgs),
                  "%s: no CUDA packages" % name)
            continue
        version, nccl = vals.get("CUDA_VERSION", ""), vals.get("NCCL_VERSION", "")
        dash = version.replace(".", "-")
        want = {"cuda-cudart-" + dash: None, "libcublas-" + dash: None,
                "libnccl2": "%s-1+cuda%s" % (nccl, version)}
        check(all(k in pkgs and pkgs[k] == v for k, v in want.items()),
              "Dockerfile.cuda: cudart, cuBLAS and NCCL %s for CUDA %s at run time (%s)" % (nccl, version, want))
        build_pkgs = installed(insts[:len(insts) - len(final)], vals)
        check(build_pkgs.get("libnccl-dev") == want["libnccl2"] and "cuda-nvcc-" + dash in build_pkgs,
              "Dockerfile.cuda: builds with nvcc and NCCL's headers of the same versions")
        info, folder = "/usr/local/cuda/version.json", os.path.realpath("/usr/local/cuda")
        here = None
        if os.path.exists(info):
            here = json.load(open(info))["cuda"]["version"]
        elif re.match(r"cuda-\d+\.\d+$", os.path.basename(folder)):
            here = os.path.basename(folder)[5:]
        if here is not None:
            check(here == version or here.startswith(version + "."),
                  "Dockerfile.cuda: CUDA %s, as the toolkit Bazel builds against here (%s)" % (version, here))
        header = "/usr/local/cuda/include/nccl.h"
        if os.path.exists(header):
            text = open(header).read()
            here = ".".join(re.search(r"#define NCCL_%s (\d+)" % k, text).group(1)
                            for k in ("MAJOR", "MINOR", "PATCH"))
            check(here == nccl, "Dockerfile.cuda: NCCL %s, as the headers Bazel builds against here (%s)"
                  % (nccl, here))
        check(any(w == "ENV" and "/usr/local/cuda-${CUDA_VERSION}/lib64" in r for w, r in final),
              "Dockerfile.cuda: the loader finds cudart and cuBLAS in the toolkit's folder")


main()
finish()
