// Package grafana holds pd-sidecar's Grafana dashboard (pd-sidecar.json,
// embedded as JSON) and reads the PromQL queries out of it, for the tests
// that check them against the exported metrics and against a real
// Prometheus.
package grafana

import (
	_ "embed"
	"encoding/json"
	"fmt"
)

// JSON is deploy/grafana/pd-sidecar.json.
//
//go:embed pd-sidecar.json
var JSON []byte

// Query is one PromQL expression of a dashboard.
type Query struct {
	// Where names it: a panel's title and the target's refId, or a
	// variable's name.
	Where string
	// Expr is the expression as written, Grafana variables ($namespace,
	// $__rate_interval, ...) included; a query variable's is
	// label_values(selector, label).
	Expr string
}

// Queries returns every query of dashboard: the targets of its panels
// (rows' nested panels included) and its query variables. A non-row
// panel without a target, or a target without an expression, is an error.
func Queries(dashboard []byte) ([]Query, error) {
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(dashboard, &d); err != nil {
		return nil, fmt.Errorf("grafana: dashboard: %w", err)
	}
	var out []Query
	var walk func(ps []panel) error
	walk = func(ps []panel) error {
		for _, p := range ps {
			if err := walk(p.Panels); err != nil {
				return err
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				return fmt.Errorf("grafana: panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				if tg.Expr == "" {
					return fmt.Errorf("grafana: panel %q: target %s has no expr", p.Title, tg.RefID)
				}
				out = append(out, Query{Where: "panel " + p.Title + ": " + tg.RefID, Expr: tg.Expr})
			}
		}
		return nil
	}
	if err := walk(d.Panels); err != nil {
		return nil, err
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		// The query is a string, or an object holding it.
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q.Query); err != nil {
			if err := json.Unmarshal(v.Query, &q); err != nil {
				return nil, fmt.Errorf("grafana: variable %q: %w", v.Name, err)
			}
		}
		if q.Query == "" {
			return nil, fmt.Errorf("grafana: variable %q has no query", v.Name)
		}
		out = append(out, Query{Where: "variable " + v.Name, Expr: q.Query})
	}
	return out, nil
}

type panel struct {
	Title   string  `json:"title"`
	Type    string  `json:"type"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}
