#!/usr/bin/env python3
"""Writes a strict JSON schema (draft 7) of a custom resource from the
models of a @kubernetes-models package (generated from the project's Go API
types, the source of its CRD's openAPIV3Schema): the Prometheus Operator's
ServiceMonitor (monitoring.coreos.com/v1) and cert-manager's Certificate
(cert-manager.io/v1), which the chart renders.

Each model's fields and which are required (no `?`) come from its class in
the .d.ts (inherited fields included); type aliases of string literals become
enums. The Kubernetes types it uses (ObjectMeta, LabelSelector,
SecretKeySelector, ...) are taken from the strict Kubernetes schema
(generate.py), so every file speaks of one Kubernetes version. Every object
schema sets additionalProperties to false, as the API server's strict field
validation does for a structural CRD schema: a misspelled field fails.

Checked against the package's own validator (node, 2026-11-24): the chart's
ServiceMonitor is valid under both; a wrong enum value or type is refused by
both; an unknown field only here (that validator lets them through).

  npm pack @kubernetes-models/prometheus-operator@6.0.0
  tar xzf kubernetes-models-prometheus-operator-6.0.0.tgz
  python3 tools/k8s-schemas/generate_crd.py package \\
      third_party/kubernetes-schemas/kubernetes-1.33-strict.json \\
      monitoring.coreos.com/v1/ServiceMonitor "Prometheus Operator ServiceMonitor" \\
      > third_party/kubernetes-schemas/servicemonitor-strict.json
  npm pack @kubernetes-models/cert-manager@6.0.0   (the same, into package/)
  python3 tools/k8s-schemas/generate_crd.py package \\
      third_party/kubernetes-schemas/kubernetes-1.33-strict.json \\
      cert-manager.io/v1/Certificate "cert-manager Certificate" \\
      > third_party/kubernetes-schemas/certificate-strict.json
"""
import json
import os
import re
import sys

PREFIX = "IComGithubPrometheusOperatorPrometheusOperatorPkgApisMonitoring"

# Kubernetes types by the module they are imported from.
K8S_SCALARS = {
    "@kubernetes-models/apimachinery/util/intstr/IntOrString": {"type": ["integer", "string"]},
    "@kubernetes-models/apimachinery/api/resource/Quantity": {"type": ["string", "number"]},
    "@kubernetes-models/apimachinery/apis/meta/v1/Time": {"type": "string"},
}


def strip_comments(text):
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def split_top(s, sep):
    """Splits `s` at `sep` outside <>, {} and quotes."""
    parts, depth, cur, quote = [], 0, "", None
    for ch in s:
        if quote:
            cur += ch
            if ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "<{(":
            depth += 1
        elif ch in ">})":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


class Generator:
    def __init__(self, package, k8s):
        self.package = package
        self.k8s = k8s["definitions"]
        self.definitions = {}

    def k8s_definition(self, name):
        """Copies a Kubernetes definition, and those it refers to."""
        if name in self.definitions:
            return
        if name not in self.k8s:
            raise SystemExit("%s: not in the Kubernetes schema" % name)
        d = self.k8s[name]
        self.definitions[name] = d
        for ref in re.findall(r'"#/definitions/([A-Za-z0-9]+)"', json.dumps(d)):
            self.k8s_definition(ref)

    def imports(self, text, directory):
        out = {}
        for names, module in re.findall(r"import \{([^}]*)\} from \"([^\"]+)\";", text):
            for n in names.split(","):
                n = n.strip()
                if n:
                    out[n] = module if not module.startswith(".") else \
                        os.path.normpath(os.path.join(directory, module.replace(".js", "")))
        return out

    def model(self, path):
        """The schema reference for the model in `path` (no extension)."""
        name = os.path.basename(path)
        version = os.path.basename(os.path.dirname(path))
        group = os.path.basename(os.path.dirname(os.path.dirname(path)))
        key = "%s.%s.%s" % (group, version, name)
        if key in self.definitions:
            return {"$ref": "#/definitions/" + key}
        text = strip_comments(open(path + ".d.ts").read())
        imports = self.imports(text, os.path.dirname(path))
        alias = re.search(r"export type I%s = (.+?);\n" % re.escape(name), text, re.S)
        if alias:
            self.definitions[key] = self.type_schema(alias.group(1).strip(), imports)
            return {"$ref": "#/definitions/" + key}
        body = re.search(r"export declare class %s extends Model<[^>]*> implements [^{]*\{(.*?)\n\s*constructor"
                         % re.escape(name), text, re.S)
        if not body:
            raise SystemExit("%s: no class or type alias" % path)
        self.definitions[key] = {}  # a placeholder while its fields resolve (recursive types)
        props, required = {}, []
        for field in split_top(body.group(1), ";"):
            if field.startswith("static "):
                continue
            m = re.fullmatch(r"\"([^\"]+)\"(\??): (.+)", field, re.S)
            if not m:
                raise SystemExit("%s: cannot read field %r" % (path, field))
            props[m.group(1)] = self.type_schema(m.group(3).strip(), imports)
            if not m.group(2):
                required.append(m.group(1))
        d = {"type": "object", "additionalProperties": False, "properties": props}
        if required:
            d["required"] = sorted(required)
        self.definitions[key] = d
        return {"$ref": "#/definitions/" + key}

    def type_schema(self, t, imports):
        t = " ".join(t.split())
        options = split_top(t, "|")
        if len(options) > 1:
            if all(re.fullmatch(r"\"[^\"]*\"", o) for o in options):
                return {"type": "string", "enum": [o[1:-1] for o in options]}
            return {"anyOf": [self.type_schema(o, imports) for o in options]}
        if t in ("string", "number", "boolean"):
            return {"type": t}
        if t in ("any", "unknown"):
            return {}
        if re.fullmatch(r"\"[^\"]*\"", t):
            return {"const": t[1:-1]}
        m = re.fullmatch(r"Array<(.+)>", t)
        if m:
            return {"type": "array", "items": self.type_schema(m.group(1), imports)}
        m = re.fullmatch(r"\{ \[key: string\]: (.+?);? \}", t)
        if m:
            return {"type": "object", "additionalProperties": self.type_schema(m.group(1), imports)}
        if t in imports:
            module = imports[t]
            if module in K8S_SCALARS:
                return dict(K8S_SCALARS[module])
            m = re.fullmatch(r"(?:@kubernetes-models/apimachinery/apis/meta|kubernetes-models)/(v1)/(\w+)",
                             module)
            if m:
                self.k8s_definition("V1" + m.group(2))
                return {"$ref": "#/definitions/V1" + m.group(2)}
            if module.startswith(self.package):
                return self.model(module)
            raise SystemExit("%s: from %s, which this generator does not know" % (t, module))
        raise SystemExit("unknown type %r" % t)


def main():
    package, k8s_path, model_path, title = sys.argv[1:5]
    k8s = json.load(open(k8s_path))
    g = Generator(os.path.abspath(package), k8s)
    root = g.model(os.path.join(os.path.abspath(package), model_path))
    name = root["$ref"].split("/")[-1]
    d = g.definitions[name]  # an object always has these, whatever its model says
    d["required"] = sorted(set(d.get("required", [])) | {"apiVersion", "kind", "metadata"})
    meta = json.load(open(os.path.join(package, "package.json")))
    json.dump({"$schema": "http://json-schema.org/draft-07/schema#",
               "title": "%s, strict (from %s %s's models; "
                        "Kubernetes types from Kubernetes %s)" % (title, meta["name"], meta["version"],
                                                                  k8s["kubernetes"]),
               "kinds": {"%s %s" % (os.path.dirname(model_path), os.path.basename(model_path)):
                         "#/definitions/" + name},
               "definitions": dict(sorted(g.definitions.items()))},
              sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
