package opensandboxtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// kind is a JSON schema type, as far as the specs use them.
type kind int

const (
	kObject kind = iota
	kString
	kInt
	kBool
	kArray
	kStringMap
	kAny
)

// schema is the part of an OpenAPI schema the fake checks.
type schema struct {
	kind     kind
	props    map[string]*schema
	required []string
	// closed is additionalProperties: false. An open object's unknown
	// fields are accepted (as the real server does) but still recorded.
	closed    bool
	items     *schema
	minItems  int
	min       *int64
	nullable  bool
	enum      []string
	minLength int
}

func ptr(n int64) *int64 { return &n }

// The request schemas, from sandbox-lifecycle.yml and execd-api.yaml.
var (
	imageSpec = &schema{kind: kObject, closed: true, required: []string{"uri"}, props: map[string]*schema{
		"uri":  {kind: kString, minLength: 1},
		"auth": {kind: kObject, closed: true, props: map[string]*schema{"username": {kind: kString}, "password": {kind: kString}}},
	}}
	platformSpec = &schema{kind: kObject, closed: true, required: []string{"os", "arch"}, props: map[string]*schema{
		"os":   {kind: kString, enum: []string{"linux", "windows"}},
		"arch": {kind: kString, enum: []string{"amd64", "arm64"}},
	}}
	networkPolicy = &schema{kind: kObject, closed: true, props: map[string]*schema{
		"defaultAction": {kind: kString, enum: []string{"allow", "deny"}},
		"egress": {kind: kArray, items: &schema{kind: kObject, closed: true, required: []string{"action", "target"}, props: map[string]*schema{
			"action": {kind: kString, enum: []string{"allow", "deny"}},
			"target": {kind: kString},
		}}},
	}}
	createSandboxSchema = &schema{kind: kObject, props: map[string]*schema{
		"image":           imageSpec,
		"snapshotId":      {kind: kString, minLength: 1},
		"platform":        platformSpec,
		"timeout":         {kind: kInt, min: ptr(60), nullable: true},
		"resourceLimits":  {kind: kStringMap},
		"env":             {kind: kStringMap},
		"metadata":        {kind: kStringMap},
		"entrypoint":      {kind: kArray, minItems: 1, items: &schema{kind: kString}},
		"networkPolicy":   networkPolicy,
		"credentialProxy": {kind: kObject, closed: true, props: map[string]*schema{"enabled": {kind: kBool}}},
		"secureAccess":    {kind: kBool},
		"volumes":         {kind: kArray, items: &schema{kind: kAny}},
		"extensions":      {kind: kStringMap},
	}}
	createSnapshotSchema = &schema{kind: kObject, closed: true, props: map[string]*schema{
		"name": {kind: kString, minLength: 1},
	}}
	renewSchema = &schema{kind: kObject, closed: true, required: []string{"expiresAt"}, props: map[string]*schema{
		"expiresAt": {kind: kString, minLength: 1},
	}}
	runCommandSchema = &schema{kind: kObject, required: []string{"command"}, props: map[string]*schema{
		"command":    {kind: kString},
		"cwd":        {kind: kString},
		"background": {kind: kBool},
		"timeout":    {kind: kInt},
		"uid":        {kind: kInt, min: ptr(0)},
		"gid":        {kind: kInt, min: ptr(0)},
		"envs":       {kind: kStringMap},
	}}
	fileMetadataSchema = &schema{kind: kObject, props: map[string]*schema{
		"path":  {kind: kString},
		"owner": {kind: kString},
		"group": {kind: kString},
		"mode":  {kind: kInt},
	}}
)

// problems are what a check found: refused are what the real server rejects
// (400); noted are departures it accepts (unknown fields of open objects).
type problems struct{ refused, noted []string }

func (p *problems) refuse(format string, args ...any) {
	p.refused = append(p.refused, fmt.Sprintf(format, args...))
}

// decodeChecked parses body strictly as one JSON value and checks it against
// s. A body that is not JSON is refused.
func decodeChecked(body []byte, s *schema) (map[string]any, problems) {
	var p problems
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		p.refuse("body is not JSON: %v", err)
		return nil, p
	}
	if dec.More() {
		p.refuse("trailing data after the JSON body")
		return nil, p
	}
	s.check("$", v, &p)
	m, _ := v.(map[string]any)
	return m, p
}

func (s *schema) check(at string, v any, p *problems) {
	if v == nil {
		if !s.nullable {
			p.refuse("%s: null is not allowed", at)
		}
		return
	}
	switch s.kind {
	case kAny:
	case kString:
		str, ok := v.(string)
		if !ok {
			p.refuse("%s: want a string", at)
			return
		}
		if len(str) < s.minLength {
			p.refuse("%s: shorter than %d", at, s.minLength)
		}
		if len(s.enum) > 0 && !contains(s.enum, str) {
			p.refuse("%s: %q is not one of %s", at, str, strings.Join(s.enum, ", "))
		}
	case kInt:
		n, ok := v.(json.Number)
		if !ok {
			p.refuse("%s: want an integer", at)
			return
		}
		i, err := n.Int64()
		if err != nil {
			p.refuse("%s: %s is not an integer", at, n)
			return
		}
		if s.min != nil && i < *s.min {
			p.refuse("%s: %d is below the minimum %d", at, i, *s.min)
		}
	case kBool:
		if _, ok := v.(bool); !ok {
			p.refuse("%s: want a boolean", at)
		}
	case kArray:
		a, ok := v.([]any)
		if !ok {
			p.refuse("%s: want an array", at)
			return
		}
		if len(a) < s.minItems {
			p.refuse("%s: fewer than %d items", at, s.minItems)
		}
		for i, e := range a {
			s.items.check(fmt.Sprintf("%s[%d]", at, i), e, p)
		}
	case kStringMap:
		m, ok := v.(map[string]any)
		if !ok {
			p.refuse("%s: want an object of strings", at)
			return
		}
		for k, e := range m {
			if _, ok := e.(string); !ok {
				p.refuse("%s.%s: want a string", at, k)
			}
		}
	case kObject:
		m, ok := v.(map[string]any)
		if !ok {
			p.refuse("%s: want an object", at)
			return
		}
		for _, r := range s.required {
			if _, ok := m[r]; !ok {
				p.refuse("%s: required field %q is missing", at, r)
			}
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			sub, ok := s.props[k]
			if !ok {
				if s.closed {
					p.refuse("%s: unknown field %q", at, k)
				} else {
					p.noted = append(p.noted, fmt.Sprintf("%s: unknown field %q (accepted, but not in the spec)", at, k))
				}
				continue
			}
			sub.check(at+"."+k, m[k], p)
		}
	}
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// Kubernetes label grammar, which sandbox metadata must follow.
var (
	labelValue  = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`)
	labelName   = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	dnsSubdomin = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// checkLabels checks metadata against the label rules: keys are a name of at
// most 63 characters with an optional DNS-subdomain prefix, the prefix
// opensandbox.io/ is reserved, values are at most 63 characters.
func checkLabels(md map[string]any, p *problems) {
	for k, v := range md {
		prefix, name, hasPrefix := strings.Cut(k, "/")
		if !hasPrefix {
			name, prefix = prefix, ""
		}
		switch {
		case hasPrefix && (len(prefix) > 253 || !dnsSubdomin.MatchString(prefix)):
			p.refuse("metadata key %q: prefix is not a DNS subdomain", k)
		case prefix == "opensandbox.io":
			p.refuse("metadata key %q: the prefix opensandbox.io/ is reserved", k)
		case len(name) > 63 || !labelName.MatchString(name):
			p.refuse("metadata key %q is not a label name", k)
		}
		s, _ := v.(string)
		if len(s) > 63 || !labelValue.MatchString(s) {
			p.refuse("metadata %s: value %q is not a label value", k, s)
		}
	}
}
