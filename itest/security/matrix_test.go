package security

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/testkit"
)

var update = flag.Bool("update", false, "rewrite the generated privilege matrix of docs/security.md")

const (
	matrixBegin = "<!-- BEGIN GENERATED privileges: go test ./itest/security -run TestPrivilegeMatrix -update -->"
	matrixEnd   = "<!-- END GENERATED privileges -->"
)

// TestPrivilegeMatrix generates, from PostgreSQL's own answers
// (has_table_privilege, has_column_privilege, has_function_privilege over
// every table, sequence and function of schema onceflow), what each role of
// deploy/sql/roles.sql and PUBLIC may do after a full migration, and
// compares it with the generated section of docs/security.md. Run it with
// -update to rewrite that section after a migration or a change of
// roles.sql.
func TestPrivilegeMatrix(t *testing.T) {
	t.Parallel()
	rs := newRoles(t)
	db := testkit.NewDB(t)
	applyRoles(t, db.URL, rs, false)
	got := privilegeMatrix(t, db, rs)

	root, err := testkit.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "docs", "security.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(doc)
	b, e := strings.Index(s, matrixBegin), strings.Index(s, matrixEnd)
	if b < 0 || e < b {
		t.Fatalf("docs/security.md has no generated section between %q and %q", matrixBegin, matrixEnd)
	}
	have := s[b+len(matrixBegin) : e]
	if have == got {
		return
	}
	if *update {
		if err := os.WriteFile(path, []byte(s[:b+len(matrixBegin)]+got+s[e:]), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote the privilege matrix of %s", path)
		return
	}
	t.Errorf("docs/security.md's privilege matrix differs from the catalog; run go test ./itest/security -run TestPrivilegeMatrix -update\n--- docs\n%s\n--- catalog\n%s", have, got)
}

// privilegeMatrix renders the matrix as Markdown, with the roles under
// their default names.
func privilegeMatrix(t *testing.T, db *testkit.DB, rs roleSet) string {
	t.Helper()
	ctx := context.Background()
	grantees := []struct{ role, name string }{
		{rs.writer, "onceflow_writer"}, {rs.relay, "onceflow_relay"}, {rs.consumer, "onceflow_consumer"}, {rs.reader, "onceflow_reader"},
		{"public", "PUBLIC"},
	}
	var sb strings.Builder
	sb.WriteString("\n\nTables and sequences (S select, I insert, U update, D delete, T truncate; a list of columns after a\n" +
		"letter: only those columns). `onceflow_owner` owns them all.\n\n| object |")
	for _, g := range grantees {
		fmt.Fprintf(&sb, " `%s` |", g.name)
	}
	sb.WriteString("\n|---|" + strings.Repeat("---|", len(grantees)) + "\n")

	rows, err := db.Pool.Query(ctx, `SELECT c.oid::regclass::text, c.relkind::text FROM pg_class c
		WHERE c.relnamespace = 'onceflow'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'S') ORDER BY c.relname`)
	if err != nil {
		t.Fatal(err)
	}
	type rel struct{ name, kind string }
	var rels []rel
	for rows.Next() {
		var r rel
		if err := rows.Scan(&r.name, &r.kind); err != nil {
			t.Fatal(err)
		}
		rels = append(rels, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, r := range rels {
		fmt.Fprintf(&sb, "| `%s` |", r.name)
		for _, g := range grantees {
			var cell []string
			if r.kind == "S" {
				for _, p := range []struct{ priv, letter string }{{"USAGE", "usage"}, {"SELECT", "S"}, {"UPDATE", "U"}} {
					var ok bool
					if err := db.Pool.QueryRow(ctx, `SELECT has_sequence_privilege($1, $2::regclass, $3)`, g.role, r.name, p.priv).Scan(&ok); err != nil {
						t.Fatal(err)
					}
					if ok {
						cell = append(cell, p.letter)
					}
				}
			} else {
				for _, p := range []struct{ priv, letter string }{{"SELECT", "S"}, {"INSERT", "I"}, {"UPDATE", "U"}, {"DELETE", "D"}, {"TRUNCATE", "T"}} {
					var whole bool
					if err := db.Pool.QueryRow(ctx, `SELECT has_table_privilege($1, $2::regclass, $3)`, g.role, r.name, p.priv).Scan(&whole); err != nil {
						t.Fatal(err)
					}
					if whole {
						cell = append(cell, p.letter)
						continue
					}
					if p.priv == "DELETE" || p.priv == "TRUNCATE" {
						continue // no column privileges of these
					}
					var cols []string
					if err := db.Pool.QueryRow(ctx, `SELECT coalesce(array_agg(a.attname::text ORDER BY a.attnum)
						FILTER (WHERE has_column_privilege($1, $2::regclass, a.attnum, $3)), '{}')
						FROM pg_attribute a WHERE a.attrelid = $2::regclass AND a.attnum > 0 AND NOT a.attisdropped`, g.role, r.name, p.priv).
						Scan(&cols); err != nil {
						t.Fatal(err)
					}
					if len(cols) > 0 {
						cell = append(cell, p.letter+"("+strings.Join(cols, ", ")+")")
					}
				}
			}
			fmt.Fprintf(&sb, " %s |", strings.Join(cell, " "))
		}
		sb.WriteString("\n")
	}

	sb.WriteString("\nFunctions (x: may execute). SECURITY DEFINER functions run with `onceflow_owner`'s rights; every\n" +
		"function but `source_shard` has `search_path = pg_catalog, pg_temp` (`source_shard` names every operator\n" +
		"and function with its schema instead, so that the planner can still inline it).\n\n| function | security definer | search_path |")
	for _, g := range grantees {
		fmt.Fprintf(&sb, " `%s` |", g.name)
	}
	sb.WriteString("\n|---|---|---|" + strings.Repeat("---|", len(grantees)) + "\n")
	frows, err := db.Pool.Query(ctx, `SELECT p.oid::regprocedure::text, p.prosecdef,
		coalesce((SELECT substr(c, 13) FROM unnest(p.proconfig) AS c WHERE c LIKE 'search\_path=%'), '')
		FROM pg_proc p WHERE p.pronamespace = 'onceflow'::regnamespace ORDER BY p.oid::regprocedure::text`)
	if err != nil {
		t.Fatal(err)
	}
	type fn struct {
		sig, path string
		definer   bool
	}
	var fns []fn
	for frows.Next() {
		var f fn
		if err := frows.Scan(&f.sig, &f.definer, &f.path); err != nil {
			t.Fatal(err)
		}
		fns = append(fns, f)
	}
	if err := frows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, f := range fns {
		def := ""
		if f.definer {
			def = "yes"
		}
		path := "—"
		if f.path != "" {
			path = "`" + f.path + "`"
		}
		fmt.Fprintf(&sb, "| `%s` | %s | %s |", f.sig, def, path)
		for _, g := range grantees {
			var ok bool
			if err := db.Pool.QueryRow(ctx, `SELECT has_function_privilege($1, $2::regprocedure, 'EXECUTE')`, g.role, f.sig).Scan(&ok); err != nil {
				t.Fatal(err)
			}
			mark := ""
			if ok {
				mark = "x"
			}
			fmt.Fprintf(&sb, " %s |", mark)
		}
		sb.WriteString("\n")
	}
	sb.WriteString("\n")
	return sb.String()
}

// TestEveryFunctionPinsSearchPath: every function of schema onceflow has
// its own search_path, except two whose bodies name the schema of
// everything they use: onceflow.source_shard (a SET clause would stop its
// inlining) and onceflow.inbox_id_time_holds (the check of every inbox
// row written, where a SET clause would more than double its cost).
func TestEveryFunctionPinsSearchPath(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t)
	rows, err := db.Pool.Query(context.Background(), `SELECT p.oid::regprocedure::text FROM pg_proc p
		WHERE p.pronamespace = 'onceflow'::regnamespace
		  AND p.oid <> ALL (ARRAY['onceflow.source_shard(text, integer)'::regprocedure,
		                          'onceflow.inbox_id_time_holds(text, text, timestamptz)'::regprocedure])
		  AND NOT EXISTS (SELECT 1 FROM unnest(p.proconfig) AS c WHERE c = 'search_path=pg_catalog, pg_temp')`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var fn string
		if err := rows.Scan(&fn); err != nil {
			t.Fatal(err)
		}
		t.Errorf("%s has no search_path = pg_catalog, pg_temp", fn)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}
