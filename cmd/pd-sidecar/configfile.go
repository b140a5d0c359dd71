package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// The configuration flags: a YAML (or JSON) mapping of flag names to values,
// inline or from a file, as llm-d's sidecar takes.
const (
	flagConfiguration     = "configuration"
	flagConfigurationFile = "configuration-file"
)

// notConfigKeys are the flags a configuration may not set: the two
// configuration flags themselves (a configuration cannot name another) and
// --help.
var notConfigKeys = map[string]bool{flagConfiguration: true, flagConfigurationFile: true, "help": true}

// parseWithConfiguration declares --configuration and --configuration-file
// on fs, parses args and then applies the configuration they name: every
// key is the name of a flag of fs, and its value is applied only where
// that flag (or an alias of it, a flag writing to the same variable) was
// not given on the command line. Flag defaults already carry the
// environment, so the precedence is command line > configuration >
// environment > built-in default. readFile reads --configuration-file
// (os.ReadFile).
func parseWithConfiguration(fs *pflag.FlagSet, args []string, readFile func(string) ([]byte, error)) error {
	inline := fs.String(flagConfiguration, "", "sidecar configuration as inline YAML or JSON: a mapping of flag names (without --) to values, e.g. '{port: 8000, enable-tls: [prefiller]}'; flags given on the command line win")
	file := fs.String(flagConfigurationFile, "", "file holding the sidecar configuration (YAML or JSON, as --configuration)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var src string
	var doc []byte
	switch {
	case fs.Changed(flagConfiguration) && fs.Changed(flagConfigurationFile):
		return fmt.Errorf("--%s and --%s are mutually exclusive", flagConfiguration, flagConfigurationFile)
	case *file != "":
		src = "--" + flagConfigurationFile + " " + *file
		b, err := readFile(*file)
		if err != nil {
			return fmt.Errorf("%s: %w", src, err)
		}
		doc = b
	case *inline != "":
		src, doc = "--"+flagConfiguration, []byte(*inline)
	default:
		return nil
	}
	if err := applyConfiguration(fs, doc); err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	return nil
}

// applyConfiguration sets the flags of fs that doc (YAML or JSON) names and
// the command line did not.
func applyConfiguration(fs *pflag.FlagSet, doc []byte) error {
	js, err := yaml.YAMLToJSONStrict(doc) // refuses duplicate keys
	if err != nil {
		return fmt.Errorf("not valid YAML or JSON: %s", oneLine(err))
	}
	if t := bytes.TrimSpace(js); len(t) == 0 || string(t) == "null" {
		return nil // an empty document
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(js, &keys); err != nil {
		return fmt.Errorf("not a mapping of flag names to values")
	}
	// Deprecated aliases first, so that a configuration naming both an
	// alias and its flag (vllm-port and model-server-port) ends with the
	// flag's value; otherwise in name order, for one deterministic result.
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	deprecated := func(name string) bool {
		f := fs.Lookup(name)
		return f != nil && f.Deprecated != ""
	}
	sort.Slice(names, func(i, j int) bool {
		if di, dj := deprecated(names[i]), deprecated(names[j]); di != dj {
			return di
		}
		return names[i] < names[j]
	})
	var cli []*pflag.Flag // the flags set on the command line
	fs.Visit(func(f *pflag.Flag) { cli = append(cli, f) })
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil || notConfigKeys[name] {
			return fmt.Errorf("unknown key %q (keys are flag names, without --; see --help)", name)
		}
		if givenOnCommandLine(cli, f) {
			continue
		}
		if err := setFromConfig(fs, f, keys[name]); err != nil {
			return fmt.Errorf("key %q: %w", name, err)
		}
	}
	return nil
}

// givenOnCommandLine reports whether f, or a flag writing to the same
// variable (an alias such as --vllm-port of --model-server-port), is
// among the flags set on the command line.
func givenOnCommandLine(cli []*pflag.Flag, f *pflag.Flag) bool {
	for _, o := range cli {
		if o == f || sameVariable(o.Value, f.Value) || configAliases[f.Name] == o.Name {
			return true
		}
	}
	return false
}

// configAliases pairs a deprecated flag kept in a variable of its own with
// the flag it stands for (--vllm-port, resolved against --model-server-port
// after parsing): a key of either is not applied when the other was given
// on the command line.
var configAliases = map[string]string{"vllm-port": "model-server-port", "model-server-port": "vllm-port"}

// sameVariable: a and b are pflag's values over one variable (both
// pointers of one type to one address).
func sameVariable(a, b pflag.Value) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	return va.Kind() == reflect.Pointer && va.Type() == vb.Type() && va.Pointer() == vb.Pointer()
}

// setFromConfig sets f from a configuration value, checking its JSON type
// against the flag's: booleans for bool flags, integers for integer flags,
// strings for strings and durations ("300ms"), sequences for lists. The
// flag is then Changed, as if given: code that asks whether a flag was set
// (to fall back on an environment variable, say) sees the file's value as
// set.
func setFromConfig(fs *pflag.FlagSet, f *pflag.Flag, raw json.RawMessage) error {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return fmt.Errorf("unreadable value: %w", err)
	}
	if v == nil {
		return nil // "key:" with no value: the flag keeps its default
	}
	typ := f.Value.Type()
	want := func(what string) error {
		return fmt.Errorf("want %s (flag type %s), got %s", what, typ, describe(v))
	}
	var text string
	switch {
	case typ == "bool":
		b, ok := v.(bool)
		if !ok {
			return want("true or false")
		}
		text = fmt.Sprint(b)
	case isIntType(typ):
		n, ok := v.(json.Number)
		if !ok || strings.ContainsAny(n.String(), ".eE") {
			return want("an integer")
		}
		text = n.String()
	case typ == "float32" || typ == "float64":
		n, ok := v.(json.Number)
		if !ok {
			return want("a number")
		}
		text = n.String()
	case typ == "string" || typ == "duration":
		s, ok := v.(string)
		if !ok {
			return want("a string")
		}
		text = s
	case strings.HasSuffix(typ, "Slice") || strings.HasSuffix(typ, "Array"):
		seq, ok := v.([]any)
		if !ok {
			return want("a list")
		}
		items := make([]string, len(seq))
		for i, e := range seq {
			s, ok := scalarText(e)
			if !ok {
				return fmt.Errorf("item %d: want a string or number, got %s", i, describe(e))
			}
			items[i] = s
		}
		if sv, ok := f.Value.(pflag.SliceValue); ok { // items as they are, commas included
			if err := sv.Replace(items); err != nil {
				return fmt.Errorf("%v: %w", items, err)
			}
			f.Changed = true
			return nil
		}
		text = strings.Join(items, ",")
	default: // a flag type of its own (a level, an enum): its text form
		s, ok := scalarText(v)
		if !ok {
			return want("a string or number")
		}
		text = s
	}
	if err := fs.Set(f.Name, text); err != nil {
		return err // names the value and the flag
	}
	return nil
}

func isIntType(typ string) bool {
	switch typ {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64", "count":
		return true
	}
	return false
}

// scalarText is the text of a string, number or boolean.
func scalarText(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case json.Number:
		return v.String(), true
	case bool:
		return fmt.Sprint(v), true
	}
	return "", false
}

// describe names a configuration value's type and shows it, for errors.
func describe(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("the string %q", v)
	case json.Number:
		return "the number " + v.String()
	case bool:
		return fmt.Sprintf("the boolean %t", v)
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping"
	}
	return fmt.Sprintf("%v", v)
}

// oneLine folds a multi-line error into one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
