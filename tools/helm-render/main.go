// helm-render renders a Helm chart offline, the way `helm template` does,
// for machines without a helm binary: Go's text/template with the sprig
// functions (Debian's golang-github-masterminds-sprig-dev) plus Helm's own
// (include, tpl, toYaml, fromYaml, toJson, required, .Files.Get), values
// merged from values.yaml, -f files and --set, and checked against the
// chart's values.schema.json (gojsonschema, as Helm does).
//
//	helm-render [--name R] [--namespace N] [-f values.yaml]... [--set a.b=v]... CHART_DIR
//
// Prints every rendered template as a YAML document headed by
// "# Source: <chart>/templates/<file>", like helm template. Errors name
// the file and the value at fault; the exit status is then 1.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig/v3"
	"github.com/xeipuuv/gojsonschema"
	"gopkg.in/yaml.v3"
)

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

type files map[string][]byte

func (f files) Get(name string) string { return string(f[name]) }

func die(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "helm-render: "+format+"\n", args...)
	os.Exit(1)
}

// normalize turns yaml.v3's values into JSON's (map[string]interface{},
// []interface{}, float64 for numbers), which is what Helm's templates see.
func normalize(v interface{}) (interface{}, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out interface{}
	return out, json.Unmarshal(b, &out)
}

func readYAML(path string) map[string]interface{} {
	b, err := os.ReadFile(path)
	if err != nil {
		die("%v", err)
	}
	var m map[string]interface{}
	if err := yaml.Unmarshal(b, &m); err != nil {
		die("%s: %v", path, err)
	}
	if m == nil {
		m = map[string]interface{}{}
	}
	n, err := normalize(m)
	if err != nil {
		die("%s: %v", path, err)
	}
	return n.(map[string]interface{})
}

func merge(dst, src map[string]interface{}) {
	for k, v := range src {
		if v == nil { // as Helm: a null removes the default
			delete(dst, k)
			continue
		}
		if sm, ok := v.(map[string]interface{}); ok {
			if dm, ok := dst[k].(map[string]interface{}); ok {
				merge(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

// set applies one --set a.b.c=value (the value parsed as a YAML scalar).
func set(values map[string]interface{}, assignment string) {
	eq := strings.Index(assignment, "=")
	if eq <= 0 {
		die("--set %q: want key=value", assignment)
	}
	keys := strings.Split(assignment[:eq], ".")
	var v interface{}
	if err := yaml.Unmarshal([]byte(assignment[eq+1:]), &v); err != nil {
		v = assignment[eq+1:]
	}
	v, _ = normalize(v)
	m := values
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]interface{})
		if !ok {
			next = map[string]interface{}{}
			m[k] = next
		}
		m = next
	}
	if v == nil { // as Helm: --set key=null removes the default
		delete(m, keys[len(keys)-1])
		return
	}
	m[keys[len(keys)-1]] = v
}

func toYAML(v interface{}) string {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return ""
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

func main() {
	var valueFiles, sets multiFlag
	name := flag.String("name", "loom", "release name")
	namespace := flag.String("namespace", "default", "release namespace")
	flag.Var(&valueFiles, "f", "values file (repeatable)")
	flag.Var(&sets, "set", "key=value (repeatable)")
	notes := flag.Bool("notes", false, "print templates/NOTES.txt rendered (as helm install shows it) instead of the objects")
	flag.Parse()
	if flag.NArg() != 1 {
		die("usage: helm-render [--name R] [--namespace N] [-f values.yaml]... [--set k=v]... CHART_DIR")
	}
	dir := flag.Arg(0)
	chart := readYAML(filepath.Join(dir, "Chart.yaml"))
	values := readYAML(filepath.Join(dir, "values.yaml"))
	for _, f := range valueFiles {
		merge(values, readYAML(f))
	}
	for _, s := range sets {
		set(values, s)
	}

	if schema, err := os.ReadFile(filepath.Join(dir, "values.schema.json")); err == nil {
		result, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(schema), gojsonschema.NewGoLoader(values))
		if err != nil {
			die("values.schema.json: %v", err)
		}
		if !result.Valid() {
			var msgs []string
			for _, e := range result.Errors() {
				msgs = append(msgs, fmt.Sprintf("%s: %s", e.Field(), e.Description()))
			}
			die("values don't meet the specifications of the schema:\n- %s", strings.Join(msgs, "\n- "))
		}
	}

	chartName, _ := chart["name"].(string)
	all := files{}
	var templates []string
	err := filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if info.IsDir() {
			return nil
		}
		b, err := os.ReadFile(path) // follows symlinks (the dashboards)
		if err != nil {
			return err
		}
		all[rel] = b
		if strings.HasPrefix(rel, "templates/") {
			templates = append(templates, rel)
		}
		return nil
	})
	if err != nil {
		die("%v", err)
	}
	// Symlinked folders are not walked by filepath.Walk; read them too.
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if fi, err := os.Stat(p); err == nil && fi.IsDir() && e.Type()&os.ModeSymlink != 0 {
			sub, _ := os.ReadDir(p)
			for _, s := range sub {
				if b, err := os.ReadFile(filepath.Join(p, s.Name())); err == nil {
					all[filepath.Join(e.Name(), s.Name())] = b
				}
			}
		}
	}
	sort.Strings(templates)

	root := template.New("chart")
	funcs := sprig.TxtFuncMap()
	funcs["toYaml"] = toYAML
	funcs["fromYaml"] = func(s string) map[string]interface{} {
		var m map[string]interface{}
		if err := yaml.Unmarshal([]byte(s), &m); err != nil {
			return map[string]interface{}{"Error": err.Error()}
		}
		return m
	}
	funcs["toJson"] = func(v interface{}) string {
		b, err := json.Marshal(v)
		if err != nil {
			return ""
		}
		return string(b)
	}
	funcs["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil {
			return nil, fmt.Errorf(msg)
		}
		if s, ok := v.(string); ok && s == "" {
			return nil, fmt.Errorf(msg)
		}
		return v, nil
	}
	funcs["include"] = func(name string, data interface{}) (string, error) {
		var buf bytes.Buffer
		err := root.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	funcs["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := root.Clone()
		if err != nil {
			return "", err
		}
		t, err = t.New("tpl").Parse(text)
		if err != nil {
			return "", err
		}
		var buf bytes.Buffer
		err = t.Execute(&buf, data)
		return buf.String(), err
	}
	root.Funcs(funcs).Option("missingkey=zero")
	for _, name := range templates {
		if _, err := root.New(chartName + "/" + name).Parse(string(all[name])); err != nil {
			die("%v", err)
		}
	}

	data := map[string]interface{}{
		"Values":  values,
		"Release": map[string]interface{}{"Name": *name, "Namespace": *namespace, "Service": "Helm", "IsInstall": true},
		"Chart": map[string]interface{}{
			"Name": chartName, "Version": chart["version"], "AppVersion": chart["appVersion"],
		},
		"Capabilities": map[string]interface{}{
			"KubeVersion": map[string]interface{}{"Version": "v1.28.0", "Major": "1", "Minor": "28"},
		},
		"Files": all,
	}
	out := bufio()
	if *notes {
		data["Template"] = map[string]interface{}{"Name": chartName + "/templates/NOTES.txt", "BasePath": chartName + "/templates"}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, chartName+"/templates/NOTES.txt", data); err != nil {
			die("%v", err)
		}
		os.Stdout.Write(buf.Bytes())
		return
	}
	for _, name := range templates {
		base := filepath.Base(name)
		if strings.HasPrefix(base, "_") || base == "NOTES.txt" {
			continue
		}
		data["Template"] = map[string]interface{}{"Name": chartName + "/" + name, "BasePath": chartName + "/templates"}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, chartName+"/"+name, data); err != nil {
			die("%v", err)
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		for _, doc := range strings.Split(text, "\n---") {
			if strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" {
				continue
			}
			fmt.Fprintf(out, "---\n# Source: %s/%s\n%s\n", chartName, name, strings.Trim(strings.TrimPrefix(doc, "---"), "\n"))
		}
	}
	os.Stdout.Write(out.Bytes())
}

func bufio() *bytes.Buffer { return &bytes.Buffer{} }
