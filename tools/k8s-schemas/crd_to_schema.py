#!/usr/bin/env python3
"""Writes a strict JSON schema (draft 7) of a custom resource from its
CustomResourceDefinition's own openAPIV3Schema (the YAML the project
publishes), for the CRDs without a @kubernetes-models package: the
scheduler-plugins PodGroup (scheduling.x-k8s.io/v1alpha1), which the chart
renders for gang scheduling (workload.podGroup).

As the API server treats a structural schema: every object with properties
and no additionalProperties or x-kubernetes-preserve-unknown-fields allows
no other field (a misspelled field fails); x-kubernetes-int-or-string is an
integer or a string. metadata is Kubernetes' ObjectMeta, from the strict
Kubernetes schema (generate.py), so every file speaks of one version.

  python3 tools/k8s-schemas/crd_to_schema.py \\
      third_party/kubernetes-schemas/crds/scheduling.x-k8s.io_podgroups.yaml v1alpha1 \\
      third_party/kubernetes-schemas/kubernetes-1.33-strict.json \\
      "scheduler-plugins PodGroup (kubernetes-sigs/scheduler-plugins 903da7df)" \\
      > third_party/kubernetes-schemas/podgroup-strict.json
"""
import json
import sys

import yaml

DROP = {"description", "format", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type"}


def strict(node):
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k in DROP:
            continue
        if k == "properties":
            out[k] = {name: strict(p) for name, p in v.items()}
        elif k in ("items", "additionalProperties") and isinstance(v, dict):
            out[k] = strict(v)
        elif k in ("anyOf", "allOf", "oneOf"):
            out[k] = [strict(x) for x in v]
        elif k == "x-kubernetes-int-or-string":
            out["type"] = ["integer", "string"]
        elif k == "x-kubernetes-preserve-unknown-fields":
            continue
        else:
            out[k] = v
    if "anyOf" in out and out.get("type") == ["integer", "string"]:
        del out["anyOf"]  # the same, said twice
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out \
            and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def main():
    crd_path, version, k8s_path, title = sys.argv[1:5]
    crd = yaml.safe_load(open(crd_path))
    k8s = json.load(open(k8s_path))
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    served = [v for v in crd["spec"]["versions"] if v["name"] == version]
    if not served:
        sys.exit("%s: no version %s" % (crd_path, version))
    root = strict(served[0]["schema"]["openAPIV3Schema"])
    api = "%s/%s" % (group, version)
    root["properties"]["apiVersion"] = {"const": api}
    root["properties"]["kind"] = {"const": kind}
    root["properties"]["metadata"] = {"$ref": "#/definitions/V1ObjectMeta"}
    root["required"] = sorted(set(root.get("required", [])) | {"apiVersion", "kind", "metadata"})
    definitions = {}

    def take(name):  # ObjectMeta and what it refers to
        if name in definitions:
            return
        definitions[name] = k8s["definitions"][name]
        for ref in json.dumps(definitions[name]).split('"#/definitions/')[1:]:
            take(ref.split('"')[0])

    take("V1ObjectMeta")
    name = "%s.%s.%s" % (group, version, kind)
    definitions[name] = root
    print(json.dumps({"$schema": "http://json-schema.org/draft-07/schema#",
                      "title": "%s, strict (from its CRD's openAPIV3Schema; Kubernetes types "
                               "from Kubernetes %s)" % (title, k8s["kubernetes"]),
                      "kinds": {"%s %s" % (api, kind): "#/definitions/" + name},
                      "definitions": definitions}, sort_keys=True))


if __name__ == "__main__":
    main()
