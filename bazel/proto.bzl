"""loom_proto_library: C++ and gRPC code from .proto files, with Debian's protoc.

One macro for every proto in the tree. For srcs = ["foo.proto"] in package
proto/loom/x/v1 it generates foo.pb.{h,cc} (and foo.grpc.pb.{h,cc} when
grpc = True) with the system protoc and grpc_cpp_plugin, and wraps them in a
cc_library named `name`. The proto root is //proto, so code includes
"loom/x/v1/foo.pb.h" and protos import "loom/x/v1/foo.proto"; the
well-known types (google/protobuf/*.proto) come from libprotobuf-dev.

deps are other loom_proto_library targets whose .proto files srcs import.
A filegroup `<name>_proto` carries this library's .proto files and those of
its deps, so an importing library gets every file protoc needs.
"""

PROTO_ROOT = "proto"

def loom_proto_library(name, srcs, deps = [], grpc = True, visibility = None):
    pkg = native.package_name()
    if not (pkg == PROTO_ROOT or pkg.startswith(PROTO_ROOT + "/")):
        fail("loom_proto_library must live under //%s (got //%s)" % (PROTO_ROOT, pkg))

    native.filegroup(
        name = name + "_proto",
        srcs = srcs + [d + "_proto" for d in deps],
        visibility = visibility,
    )

    outs = []
    for src in srcs:
        if not src.endswith(".proto"):
            fail("%s: srcs must be .proto files, got %s" % (name, src))
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]

    rel = [pkg[len(PROTO_ROOT) + 1:] + "/" + s if pkg != PROTO_ROOT else s for s in srcs]
    cmd = [
        "$(location @system_tools//:protoc)",
        "--proto_path=" + PROTO_ROOT,
        "--proto_path=$$(dirname $(location @system_tools//:protobuf_wkt/ROOT))",
        "--cpp_out=$(GENDIR)/" + PROTO_ROOT,
    ]
    tools = ["@system_tools//:protoc"]
    if grpc:
        cmd += [
            "--plugin=protoc-gen-grpc=$(location @system_tools//:grpc_cpp_plugin)",
            "--grpc_out=$(GENDIR)/" + PROTO_ROOT,
        ]
        tools.append("@system_tools//:grpc_cpp_plugin")
    native.genrule(
        name = name + "_codegen",
        srcs = [name + "_proto", "@system_tools//:protobuf_wkt", "@system_tools//:protobuf_wkt/ROOT"],
        outs = outs,
        cmd = " ".join(cmd + rel),
        tools = tools,
    )

    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        strip_include_prefix = "/" + PROTO_ROOT,
        deps = deps + ["@system_protobuf//:lib"] + (["@system_grpc//:lib"] if grpc else []),
        visibility = visibility,
    )
