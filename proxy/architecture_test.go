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

// TestCoreDoesNoIO: proxy/core, a request's state and every decision on
// it, imports neither fasthttp nor the event loops, and of package net
// only its address parsing (host:port split and joined, an IP read): the
// drivers do the I/O.
func TestCoreDoesNoIO(t *testing.T) {
	parsing := map[string]bool{"SplitHostPort": true, "JoinHostPort": true, "ParseIP": true}
	for path, f := range sourceFiles(t, "core") {
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if p == "github.com/valyala/fasthttp" || strings.HasPrefix(p, "github.com/valyala/fasthttp/") ||
				p == "github.com/pd-sidecar/pd-sidecar/netloop" {
				t.Errorf("%s imports %s", path, p)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == "net" && !parsing[sel.Sel.Name] {
					t.Errorf("%s uses net.%s", path, sel.Sel.Name)
				}
			}
			return true
		})
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

// TestTypesStaySmall: no type of proxy/ has more than 40 methods in its
// method set: its own, and those it gets from the types of proxy/ it
// embeds (a part embedded to lend its methods counts as the type's).
func TestTypesStaySmall(t *testing.T) {
	const most = 40
	declared := map[string]map[string]bool{} // "pkg.Type" -> its own methods
	embeds := map[string][]string{}          // "pkg.Type" -> the proxy/ types it embeds
	for _, dir := range proxyPackages(t) {
		for _, f := range sourceFiles(t, dir) {
			pkg := f.Name.Name
			imports := map[string]string{} // local name -> package name, for proxy/ imports
			for _, im := range f.Imports {
				path, _ := strconv.Unquote(im.Path.Value)
				if !strings.Contains(path, "/proxy/") {
					continue
				}
				name := filepath.Base(path)
				if im.Name != nil {
					imports[im.Name.Name] = name
				} else {
					imports[name] = name
				}
			}
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					if d.Recv == nil {
						continue
					}
					if typ := typeName(d.Recv.List[0].Type, pkg, nil); typ != "" {
						if declared[typ] == nil {
							declared[typ] = map[string]bool{}
						}
						declared[typ][d.Name.Name] = true
					}
				case *ast.GenDecl:
					for _, sp := range d.Specs {
						ts, ok := sp.(*ast.TypeSpec)
						if !ok {
							continue
						}
						st, ok := ts.Type.(*ast.StructType)
						if !ok {
							continue
						}
						for _, fl := range st.Fields.List {
							if len(fl.Names) > 0 {
								continue
							}
							if e := typeName(fl.Type, pkg, imports); e != "" {
								embeds[pkg+"."+ts.Name.Name] = append(embeds[pkg+"."+ts.Name.Name], e)
							}
						}
					}
				}
			}
		}
	}
	var methodSet func(typ string, seen map[string]bool) map[string]bool
	methodSet = func(typ string, seen map[string]bool) map[string]bool {
		set := map[string]bool{}
		if seen[typ] {
			return set
		}
		seen[typ] = true
		for m := range declared[typ] {
			set[m] = true
		}
		for _, e := range embeds[typ] {
			for m := range methodSet(e, seen) {
				set[m] = true
			}
		}
		return set
	}
	types := map[string]bool{}
	for typ := range declared {
		types[typ] = true
	}
	for typ := range embeds {
		types[typ] = true
	}
	for typ := range types {
		if n := len(methodSet(typ, map[string]bool{})); n > most {
			t.Errorf("%s has %d methods, its own and those it embeds, at most %d", typ, n, most)
		}
	}
}

// typeName is "pkg.Type" of the type expression e in package pkg (a
// pointer, an instantiation, or with imports, a type of another proxy/
// package); "" for anything else.
func typeName(e ast.Expr, pkg string, imports map[string]string) string {
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	if ix, ok := e.(*ast.IndexExpr); ok {
		e = ix.X
	}
	switch e := e.(type) {
	case *ast.Ident:
		return pkg + "." + e.Name
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok && imports != nil {
			if name, ok := imports[x.Name]; ok {
				return name + "." + e.Sel.Name
			}
		}
	}
	return ""
}

// TestInferenceIsComposition: proxy/inference composes the sidecar (its
// core with the drivers) and writes what only fasthttp's path writes; a
// decision it grew would show in its lines.
func TestInferenceIsComposition(t *testing.T) {
	const most = 800
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
