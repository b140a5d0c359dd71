package rendertest_test

import (
	"bufio"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd, args string
}

func parseDockerfile(t *testing.T, path string) []instruction {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out []instruction
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue // a comment inside a continued instruction
		}
		if s, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.TrimSpace(args)})
		cur.Reset()
	}
	require.NoError(t, sc.Err())
	return out
}

// lastStage returns the instructions from the last FROM on.
func lastStage(ins []instruction) []instruction {
	for i := len(ins) - 1; i >= 0; i-- {
		if ins[i].cmd == "FROM" {
			return ins[i:]
		}
	}
	return nil
}

func all(ins []instruction, cmd string) []string {
	var out []string
	for _, in := range ins {
		if in.cmd == cmd {
			out = append(out, in.args)
		}
	}
	return out
}

var numericUser = regexp.MustCompile(`^[1-9][0-9]*(:[1-9][0-9]*)?$`)

// TestDockerfiles reviews both Dockerfiles for what hadolint would flag
// and what the deployment relies on (hadolint itself is not installable
// here): pinned bases, apt hygiene, a numeric non-root user, an exec-form
// entrypoint, and each image's build specifics.
func TestDockerfiles(t *testing.T) {
	tests := []struct {
		file      string
		finalFrom string
		build     []string // substrings of the go build RUN
		contains  []string // substrings anywhere
	}{
		{"../../Dockerfile", "gcr.io/distroless/static-debian12:nonroot",
			[]string{"CGO_ENABLED=0", "./cmd/pd-sidecar"}, nil},
		{"../../Dockerfile.cuda", "nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04",
			[]string{"CGO_ENABLED=1", "-tags ucx", "./cmd/pd-sidecar"},
			[]string{"COPY scripts/build-nixl.sh ", "build-nixl.sh --ucx-src=", "--with-cuda=", "NIXL_CAPI_LIB=/opt/nixl/lib/libnixl_capi.so",
				"NIXL_PLUGIN_DIR=/opt/nixl/lib/plugins"}},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			ins := parseDockerfile(t, tc.file)
			for _, from := range all(ins, "FROM") {
				image := strings.Fields(from)[0]
				assert.NotContains(t, image, ":latest", "DL3007: pin %s", image)
				assert.True(t, strings.Contains(image, ":") || !strings.Contains(image, "/"), "DL3006: tag %s", image)
			}
			final := lastStage(ins)
			require.NotEmpty(t, final)
			assert.Equal(t, tc.finalFrom, strings.Fields(final[0].args)[0])
			users := all(final, "USER")
			require.NotEmpty(t, users, "the final stage sets USER")
			assert.Regexp(t, numericUser, users[len(users)-1], "a numeric non-root user, for runAsNonRoot")
			eps := all(final, "ENTRYPOINT")
			require.Len(t, eps, 1)
			assert.Equal(t, `["/pd-sidecar"]`, eps[0], "exec form (DL3025), the binary as entrypoint")
			var build string
			for _, run := range all(ins, "RUN") {
				if strings.Contains(run, "go build") {
					build = run
				}
				if strings.Contains(run, "apt-get install") {
					assert.Contains(t, run, "--no-install-recommends", "DL3015")
					assert.Contains(t, run, "-y", "DL3014")
					assert.Contains(t, run, "rm -rf /var/lib/apt/lists/*", "DL3009")
				}
				assert.NotContains(t, run, "sudo", "DL3004")
				assert.NotRegexp(t, `(^|\s)cd\s`, run, "DL3003: use WORKDIR")
			}
			for _, w := range tc.build {
				assert.Contains(t, build, w)
			}
			b, err := os.ReadFile(tc.file)
			require.NoError(t, err)
			for _, w := range tc.contains {
				assert.Contains(t, string(b), w)
			}
			for _, c := range all(ins, "COPY") {
				assert.NotContains(t, c, "--chown=root", "no root-owned runtime files needed")
			}
			for _, r := range all(ins, "RUN") {
				if strings.Contains(r, "curl") && strings.Contains(r, "|") {
					assert.Contains(t, allShell(ins), "pipefail", "DL4006: pipefail before a pipe")
				}
			}
		})
	}
}

func allShell(ins []instruction) string { return strings.Join(all(ins, "SHELL"), " ") }

// TestCUDAImageBuildsNIXLAsLocally: Dockerfile.cuda builds UCX and NIXL with
// scripts/build-nixl.sh, the script a local build for make test-nixl runs,
// and fetches the versions that script defaults to.
func TestCUDAImageBuildsNIXLAsLocally(t *testing.T) {
	script, err := os.ReadFile("../../scripts/build-nixl.sh")
	require.NoError(t, err)
	ins := parseDockerfile(t, "../../Dockerfile.cuda")
	args := map[string]string{}
	for _, a := range all(ins, "ARG") {
		if k, v, ok := strings.Cut(a, "="); ok {
			args[k] = v
		}
	}
	for _, name := range []string{"UCX_VERSION", "NIXL_VERSION"} {
		m := regexp.MustCompile(`(?m)^` + name + `=\$\{` + name + `:-([^}]+)\}$`).FindSubmatch(script)
		require.NotNil(t, m, "scripts/build-nixl.sh defaults %s", name)
		assert.Equal(t, string(m[1]), args[name], "Dockerfile.cuda's ARG %s and the script's default", name)
	}
	var runs bool
	for _, r := range all(ins, "RUN") {
		if strings.HasPrefix(r, "build-nixl.sh ") {
			runs = true
		}
		assert.NotContains(t, r, "meson setup", "NIXL is built by the script, not beside it")
		assert.NotContains(t, r, "configure-release", "UCX is built by the script, not beside it")
	}
	assert.True(t, runs, "a RUN runs build-nixl.sh")
}
