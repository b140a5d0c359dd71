package rendertest

import (
	"regexp"
	"strings"
)

var (
	quoted     = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	matchers   = regexp.MustCompile(`\{[^{}]*\}`)
	ranges     = regexp.MustCompile(`\[[^\[\]]*\]`)
	labelLists = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	ident      = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	keywords   = map[string]bool{
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
		"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true, "inf": true, "nan": true,
	}
)

// MetricNames returns the metric names a PromQL expression (or a Grafana
// label_values(...) query) selects: label matchers, label lists, strings,
// range selectors, $variables, numbers and function names are left out.
func MetricNames(expr string) []string {
	s := quoted.ReplaceAllString(expr, `""`)
	s = matchers.ReplaceAllString(s, " ")
	s = ranges.ReplaceAllString(s, " ")
	s = labelLists.ReplaceAllString(s, " ")
	if inner, ok := strings.CutPrefix(strings.TrimSpace(s), "label_values("); ok {
		// label_values(metric, label): the last argument is a label name.
		if i := strings.LastIndexByte(inner, ','); i >= 0 {
			s = inner[:i]
		}
	}
	var out []string
	for _, loc := range ident.FindAllStringIndex(s, -1) {
		name := s[loc[0]:loc[1]]
		if loc[0] > 0 && (s[loc[0]-1] == '$' || s[loc[0]-1] == '.' || isDigit(s[loc[0]-1])) {
			continue // a $variable, a number's exponent or fraction
		}
		rest := strings.TrimLeft(s[loc[1]:], " \t\n")
		if strings.HasPrefix(rest, "(") || keywords[strings.ToLower(name)] {
			continue // a function or an operator
		}
		out = append(out, name)
	}
	return out
}

func isDigit(b byte) bool { return b >= '0' && b <= '9' }
