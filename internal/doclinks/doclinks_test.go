// Package doclinks checks the module's doc comments: every doc link
// ([Name], [Type.Method], [pkg.Name]) to a symbol of this module names a
// symbol that exists. go vet does not check them, and a renamed or removed
// symbol leaves its links behind as plain text in the rendered docs.
package doclinks

import (
	"go/ast"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/mlxserving/mlxserving"

// pkg is one parsed package of the module: its files and the names a doc
// link may resolve to ("Name", "Type.Method", "Type.Field").
type pkg struct {
	files []*ast.File
	syms  map[string]bool
}

func TestDocLinksResolve(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	pkgs := parseModule(t, root)
	if len(pkgs) < 20 {
		t.Fatalf("found %d packages under %s: the walk is broken", len(pkgs), root)
	}
	links := 0
	for importPath, p := range pkgs {
		for _, f := range p.files {
			imports := map[string]string{}
			for _, im := range f.Imports {
				ip, _ := strconv.Unquote(im.Path.Value)
				name := path.Base(ip)
				if dep := pkgs[ip]; dep != nil && len(dep.files) > 0 {
					name = dep.files[0].Name.Name
				}
				if im.Name != nil {
					name = im.Name.Name
				}
				imports[name] = ip
			}
			parser := &comment.Parser{
				LookupPackage: func(name string) (string, bool) {
					ip, ok := imports[name]
					return ip, ok
				},
				// Every well-formed [X] or [X.Y] is a link; whether it
				// resolves is what the test checks.
				LookupSym: func(recv, name string) bool { return true },
			}
			for _, g := range docComments(f) {
				for _, l := range docLinks(parser.Parse(g.Text())) {
					target, where := importPath, p
					if l.ImportPath != "" {
						target, where = l.ImportPath, pkgs[l.ImportPath]
					}
					if !strings.HasPrefix(target, module) {
						continue // the standard library and other modules
					}
					if l.ImportPath == "" && l.Recv == "" && shouting(l.Name) {
						continue // [DONE], [TOOL_CALLS]: wire text, not a link
					}
					links++
					name := l.Name
					if l.Recv != "" {
						name = l.Recv + "." + l.Name
					}
					if where == nil || (name != "" && !where.syms[name]) {
						pos := fileSet.Position(g.Pos())
						rel, _ := filepath.Rel(root, pos.Filename)
						t.Errorf("%s:%d: doc link [%s] does not resolve in %s", rel, pos.Line, linkText(l), target)
					}
				}
			}
		}
	}
	if links < 50 {
		t.Errorf("checked %d doc links to this module: the parse is broken", links)
	}
}

var fileSet = token.NewFileSet()

// parseModule parses every non-test Go file of the module's packages by
// import path (nested modules, testdata and hidden folders skipped).
func parseModule(t *testing.T, root string) map[string]*pkg {
	pkgs := map[string]*pkg{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || exists(filepath.Join(p, "go.mod"))) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fileSet, p, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(p))
		ip := module
		if rel != "." {
			ip += "/" + filepath.ToSlash(rel)
		}
		if pkgs[ip] == nil {
			pkgs[ip] = &pkg{syms: map[string]bool{}}
		}
		pkgs[ip].files = append(pkgs[ip].files, f)
		declare(pkgs[ip].syms, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// declare adds the file's package-level names, methods, struct fields and
// interface methods.
func declare(syms map[string]bool, f *ast.File) {
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || len(d.Recv.List) == 0 {
				syms[d.Name.Name] = true
				continue
			}
			syms[recvName(d.Recv.List[0].Type)+"."+d.Name.Name] = true
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					syms[s.Name.Name] = true
					var fields *ast.FieldList
					switch ty := s.Type.(type) {
					case *ast.StructType:
						fields = ty.Fields
					case *ast.InterfaceType:
						fields = ty.Methods
					}
					if fields != nil {
						for _, fl := range fields.List {
							for _, n := range fl.Names {
								syms[s.Name.Name+"."+n.Name] = true
							}
						}
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						syms[n.Name] = true
					}
				}
			}
		}
	}
}

func recvName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return recvName(e.X)
	case *ast.IndexExpr: // generic receiver T[P]
		return recvName(e.X)
	case *ast.IndexListExpr:
		return recvName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return ""
}

// docComments returns the comments go doc renders: the package's and
// those on declarations, specs and fields.
func docComments(f *ast.File) []*ast.CommentGroup {
	var out []*ast.CommentGroup
	add := func(g *ast.CommentGroup) {
		if g != nil {
			out = append(out, g)
		}
	}
	add(f.Doc)
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			add(n.Doc)
		case *ast.GenDecl:
			add(n.Doc)
		case *ast.TypeSpec:
			add(n.Doc)
		case *ast.ValueSpec:
			add(n.Doc)
		case *ast.Field:
			add(n.Doc)
		}
		return true
	})
	return out
}

// docLinks returns every doc link in a parsed comment.
func docLinks(d *comment.Doc) []*comment.DocLink {
	var out []*comment.DocLink
	var text func([]comment.Text)
	text = func(ts []comment.Text) {
		for _, t := range ts {
			switch t := t.(type) {
			case *comment.DocLink:
				out = append(out, t)
			case *comment.Link:
				text(t.Text)
			case *comment.Italic, comment.Plain:
			}
		}
	}
	var block func(comment.Block)
	block = func(b comment.Block) {
		switch b := b.(type) {
		case *comment.Paragraph:
			text(b.Text)
		case *comment.Heading:
			text(b.Text)
		case *comment.List:
			for _, it := range b.Items {
				for _, c := range it.Content {
					block(c)
				}
			}
		}
	}
	for _, b := range d.Content {
		block(b)
	}
	return out
}

// shouting reports whether a name is upper case throughout, as the SSE
// end marker [DONE] or a chat template's [TOOL_CALLS]; Go names are not.
func shouting(name string) bool {
	return strings.ToUpper(name) == name
}

func linkText(l *comment.DocLink) string {
	s := l.Name
	if l.Recv != "" {
		s = l.Recv + "." + s
	}
	if l.ImportPath != "" {
		s = path.Base(l.ImportPath) + "." + s
	}
	return s
}
