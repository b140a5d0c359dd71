// Package bytesize reads and writes sizes as people type them: 4096, 4KiB,
// 64MiB, 1GiB (KB, MB, GB are powers of 1000), for kv-probe's and
// pd-bench kv's flags and tables.
package bytesize

import (
	"fmt"
	"strconv"
	"strings"
)

// Max is the largest size Parse accepts.
const Max = 1 << 30

var units = []struct {
	suffix string
	mult   int
}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}, {"", 1}}

// Parse reads 123, 4KiB, 256KiB, 64MiB, 1GiB, 4KB... (at most Max).
func Parse(s string) (int, error) {
	for _, u := range units {
		num, ok := strings.CutSuffix(s, u.suffix)
		if !ok {
			continue
		}
		n, err := strconv.Atoi(num)
		if err != nil || n < 0 || strconv.Itoa(n) != num {
			break
		}
		if n > Max/u.mult {
			return 0, fmt.Errorf("%s is above 1GiB", s)
		}
		return n * u.mult, nil
	}
	return 0, fmt.Errorf("%q is not a size like 256KiB or 64MiB", s)
}

// ParseList reads a comma-separated list of positive sizes.
func ParseList(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := Parse(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, fmt.Errorf("%q is not positive", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// Format writes 4096 as 4KiB, 1048576 as 1MiB, 1000 as 1000B.
func Format(n int) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
