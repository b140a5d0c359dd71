package logvalue

import (
	"strings"
	"testing"
)

func TestCut(t *testing.T) {
	for _, c := range []struct {
		name, in, want string
	}{
		{"empty", "", ""},
		{"short", "10.0.0.1:8000", "10.0.0.1:8000"},
		{"exactly Max", strings.Repeat("a", Max), strings.Repeat("a", Max)},
		{"past Max", strings.Repeat("a", Max+1), strings.Repeat("a", Max) + "..."},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Cut(c.in); got != c.want {
				t.Errorf("Cut(%d bytes) = %d bytes %q..., want %d bytes", len(c.in), len(got), got[:min(len(got), 8)], len(c.want))
			}
		})
	}
}
