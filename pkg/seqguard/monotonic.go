package seqguard

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/dbtx"
)

// Column is a column name and the value to write to it.
type Column struct {
	Name  string
	Value any
}

// Overwrite is a monotonic guard: a write of a row's newest state that only
// takes effect when it is newer than what the row holds, judged by a seq
// column. Replays and out-of-order arrivals of older events then cannot
// roll the row back:
//
//	UPDATE app.accounts SET balance = $2, seq = $3 WHERE id = $1 AND seq < $3
//
// It suits handlers that overwrite state (idempotent values), not ones that
// apply deltas; see docs/seqguard.md.
type Overwrite struct {
	// Table is the table, schema-qualified ("app.accounts").
	Table string
	// Key identifies the row. For Upsert the key columns need a unique
	// constraint.
	Key []Column
	// Set are the columns overwritten.
	Set []Column
	// SeqColumn holds the seq of the state the row has (default "seq").
	SeqColumn string
}

func (o Overwrite) check() error {
	if o.Table == "" || len(o.Key) == 0 {
		return errors.New("seqguard: Overwrite needs Table and Key")
	}
	return nil
}

func (o Overwrite) seqCol() string {
	if o.SeqColumn == "" {
		return "seq"
	}
	return o.SeqColumn
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

func table(name string) string { return pgx.Identifier(strings.Split(name, ".")).Sanitize() }

// UpdateSQL is the statement Update runs: the key values are $1.., then the
// Set values, then the seq.
func (o Overwrite) UpdateSQL() string {
	var set, where []string
	n := len(o.Key)
	for i, c := range o.Set {
		set = append(set, fmt.Sprintf("%s = $%d", ident(c.Name), n+i+1))
	}
	seqArg := n + len(o.Set) + 1
	set = append(set, fmt.Sprintf("%s = $%d", ident(o.seqCol()), seqArg))
	for i, c := range o.Key {
		where = append(where, fmt.Sprintf("%s = $%d", ident(c.Name), i+1))
	}
	where = append(where, fmt.Sprintf("%s < $%d", ident(o.seqCol()), seqArg))
	return fmt.Sprintf("UPDATE %s SET %s WHERE %s", table(o.Table), strings.Join(set, ", "), strings.Join(where, " AND "))
}

// UpsertSQL is the statement Upsert runs: the row is inserted if missing,
// else overwritten only when seq is newer.
func (o Overwrite) UpsertSQL() string {
	var cols, vals, keys, set []string
	all := append(append(append([]Column{}, o.Key...), o.Set...), Column{Name: o.seqCol()})
	for i, c := range all {
		cols = append(cols, ident(c.Name))
		vals = append(vals, fmt.Sprintf("$%d", i+1))
	}
	for _, c := range o.Key {
		keys = append(keys, ident(c.Name))
	}
	for _, c := range all[len(o.Key):] {
		set = append(set, fmt.Sprintf("%s = EXCLUDED.%s", ident(c.Name), ident(c.Name)))
	}
	return fmt.Sprintf("INSERT INTO %s AS t (%s) VALUES (%s) ON CONFLICT (%s) DO UPDATE SET %s WHERE t.%s < EXCLUDED.%s",
		table(o.Table), strings.Join(cols, ", "), strings.Join(vals, ", "), strings.Join(keys, ", "),
		strings.Join(set, ", "), ident(o.seqCol()), ident(o.seqCol()))
}

func (o Overwrite) args(seq int64) []any {
	var a []any
	for _, c := range o.Key {
		a = append(a, c.Value)
	}
	for _, c := range o.Set {
		a = append(a, c.Value)
	}
	return append(a, seq)
}

// Update overwrites the existing row with the state of seq if the row's seq
// is lower, and reports whether it did (false: the row is missing or
// already at seq or newer).
func (o Overwrite) Update(ctx context.Context, q dbtx.DB, seq int64) (bool, error) {
	if err := o.check(); err != nil {
		return false, err
	}
	ct, err := q.Exec(ctx, o.UpdateSQL(), o.args(seq)...)
	if err != nil {
		return false, fmt.Errorf("guarded update of %s: %w", o.Table, err)
	}
	return ct.RowsAffected() > 0, nil
}

// Upsert inserts the row, or overwrites it if its seq is lower, and reports
// whether it wrote (false: the row is already at seq or newer).
func (o Overwrite) Upsert(ctx context.Context, q dbtx.DB, seq int64) (bool, error) {
	if err := o.check(); err != nil {
		return false, err
	}
	ct, err := q.Exec(ctx, o.UpsertSQL(), o.args(seq)...)
	if err != nil {
		return false, fmt.Errorf("guarded upsert into %s: %w", o.Table, err)
	}
	return ct.RowsAffected() > 0, nil
}
