package proxy_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The shape of proxy/, read from its source: the drivers do I/O and decide
// nothing, the split's machines import no I/O, and the sizes that say
// whether decisions have moved into one request core. Each bound below is
// where the code stands: lower it when the code goes under it; a change
// that has to raise one says why in its commit.

// sourceFiles parses the non-test Go files of dir (relative to proxy/).
func sourceFiles(t *testing.T, dir string) map[string]*ast.File {
	t.Helper()
	fset := token.NewFileSet()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]*ast.File{}
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files[p] = f
	}
	if len(files) == 0 {
		t.Fatalf("no Go files in %s", dir)
	}
	return files
}

// proxyPackages lists proxy/ and the directories under it that hold Go
// files.
func proxyPackages(t *testing.T) []string {
	t.Helper()
	dirs := []string{"."}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			if m, _ := filepath.Glob(filepath.Join(e.Name(), "*.go")); len(m) > 0 {
				dirs = append(dirs, e.Name())
			}
		}
	}
	return dirs
}

// TestDriversDecideNothing: no file of the drivers (proxy/lane,
// proxy/godriver) or of the relay names a fallback reason, a request's
// timeout, the KV load failure or its recovery, a circuit breaker call, or
// an HTTP status of its own: what a leg's answer means, when a leg times
// out, whether a failure falls back and what the client is answered are
// decided by the split's machines and the request, which the drivers feed
// facts and whose answers they execute.
func TestDriversDecideNothing(t *testing.T) {
	banned := map[string]string{
		"KVLoadFailed": "the KV load failure is judged by the request (KVAnswered, KVStreamed)",
		"Recoverable":  "a failure is marked recoverable where it is defined, and the machine decides",
		"BreakerDone":  "the breaker is told by the machine's accounting action",
		"AllowPrefill": "the breaker is asked when the split begins, by the request",
		// The request's timeouts: the machines arm them, or the request
		// says the bound (FirstByteBound).
		"PrefillTimeout":         "a timeout",
		"DecodeFirstByteTimeout": "a timeout",
		"WaitTimeout":            "a timeout",
		"RetryBackoff":           "a timeout",
		"HedgeAfter":             "a timeout",
		"KVWait":                 "a timeout",
	}
	for _, dir := range []string{"lane", "godriver", "relay"} {
		for path, f := range sourceFiles(t, dir) {
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.SelectorExpr:
					name := n.Sel.Name
					if why, ok := banned[name]; ok {
						t.Errorf("%s names %s: %s", path, name, why)
					}
					if x, ok := n.X.(*ast.Ident); ok {
						switch {
						case x.Name == "failure" && strings.HasPrefix(name, "Reason"):
							t.Errorf("%s names the fallback reason %s: the machine decides a fallback", path, name)
						case (x.Name == "fasthttp" || x.Name == "http") && strings.HasPrefix(name, "Status"):
							t.Errorf("%s names %s.%s: a status is the request's answer, which the driver executes", path, x.Name, name)
						}
					}
				case *ast.BinaryExpr:
					if n.Op == token.EQL || n.Op == token.NEQ {
						for _, e := range []ast.Expr{n.X, n.Y} {
							if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.INT {
								if v, err := strconv.Atoi(lit.Value); err == nil && v >= 100 && v <= 599 {
									t.Errorf("%s compares with %d: what a status means is the request's to say", path, v)
								}
							}
						}
					}
				}
				return true
			})
		}
	}
}

// TestMachinesImportNoIO: the split's machines and chunked decode's are
// decisions without I/O, tested over every event order without sockets.
func TestMachinesImportNoIO(t *testing.T) {
	io := []string{"net", "github.com/valyala/fasthttp", "github.com/pd-sidecar/pd-sidecar/netloop"}
	for _, dir := range []string{"split", "chunked"} {
		for path, f := range sourceFiles(t, dir) {
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				for _, bad := range io {
					if p == bad {
						t.Errorf("%s imports %s", path, p)
					}
				}
			}
		}
	}
}

// TestNoReexports: a name is used where it is defined; the packages of
// proxy/ do not re-export each other's (an exported type alias, or an
// exported constant or variable that is another package's name).
func TestNoReexports(t *testing.T) {
	const most = 1 // where the code stands: Config, which cmd names as proxy.Config
	var found []string
	for _, dir := range proxyPackages(t) {
		for path, f := range sourceFiles(t, dir) {
			for _, d := range f.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok {
					continue
				}
				for _, s := range g.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Assign.IsValid() && s.Name.IsExported() {
							found = append(found, path+": "+s.Name.Name)
						}
					case *ast.ValueSpec:
						for i, v := range s.Values {
							sel, ok := v.(*ast.SelectorExpr)
							if !ok || i >= len(s.Names) || !s.Names[i].IsExported() {
								continue
							}
							if _, pkg := sel.X.(*ast.Ident); pkg {
								found = append(found, path+": "+s.Names[i].Name)
							}
						}
					}
				}
			}
		}
	}
	sort.Strings(found)
	if len(found) > most {
		t.Errorf("%d re-exports, at most %d:\n%s", len(found), most, strings.Join(found, "\n"))
	}
}

// TestTypesStaySmall: no type of proxy/ has more than 40 methods.
func TestTypesStaySmall(t *testing.T) {
	const most = 40
	methods := map[string]int{}
	for _, dir := range proxyPackages(t) {
		for _, f := range sourceFiles(t, dir) {
			for _, d := range f.Decls {
				fn, ok := d.(*ast.FuncDecl)
				if !ok || fn.Recv == nil {
					continue
				}
				typ := fn.Recv.List[0].Type
				if s, ok := typ.(*ast.StarExpr); ok {
					typ = s.X
				}
				if ix, ok := typ.(*ast.IndexExpr); ok {
					typ = ix.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					methods[f.Name.Name+"."+id.Name]++
				}
			}
		}
	}
	for typ, n := range methods {
		if n > most {
			t.Errorf("%s has %d methods, at most %d", typ, n, most)
		}
	}
}

// TestInferenceIsComposition: proxy/inference's product lines, which go
// down as the request's decisions move into one core and its features
// into their own packages.
func TestInferenceIsComposition(t *testing.T) {
	const most = 3603 // where the code stands
	paths, err := filepath.Glob("inference/*.go")
	if err != nil {
		t.Fatal(err)
	}
	lines := 0
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		lines += strings.Count(string(b), "\n")
	}
	if lines > most {
		t.Errorf("proxy/inference has %d product lines, at most %d", lines, most)
	}
}
