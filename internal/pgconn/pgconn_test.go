package pgconn_test

import (
	"bytes"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/pgconn"
)

const secret = "pg-S3cret-never-shown"

func TestValidate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(pw, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"url", []string{"-database-url=postgres://u@db:5432/app?sslmode=verify-full"}, ""},
		// pgx reads sslrootcert while parsing, so a bad CA file fails at start.
		{"sslrootcert not a CA", []string{"-database-url=postgres://u@db:5432/app?sslmode=verify-full&sslrootcert=" + pw}, "unable to add CA"},
		{"missing url", nil, "-database-url (ONCEFLOW_DATABASE_URL) is required"},
		{"bad url", []string{"-database-url=postgres://u:" + secret + "@db:5432/app?sslmode=bogus"}, "-database-url (ONCEFLOW_DATABASE_URL)"},
		{"max conns", []string{"-database-url=postgres://db/app", "-database-max-conns=0"}, "-database-max-conns (ONCEFLOW_DATABASE_MAX_CONNS)"},
		{"password file", []string{"-database-url=postgres://u@db/app", "-database-password-file=" + pw}, ""},
		{"password file missing", []string{"-database-url=postgres://u@db/app", "-database-password-file=" + dir + "/nope"}, "-database-password-file (ONCEFLOW_DATABASE_PASSWORD_FILE)"},
		{"password file empty", []string{"-database-url=postgres://u@db/app", "-database-password-file=" + empty}, "is empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var c pgconn.Config
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			c.RegisterFlags(fs)
			err := cli.Parse(fs, tc.args)
			if err == nil {
				err = c.Validate()
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("rejected: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			case err != nil && strings.Contains(err.Error(), secret):
				t.Fatalf("error shows the password: %v", err)
			}
		})
	}
}

func TestRedaction(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"postgres://app:" + secret + "@db:5432/app?sslmode=verify-full&sslrootcert=/etc/ca.pem",
		"postgres://app@db:5432/app?sslmode=verify-full&password=" + secret,
		"host=db user=app password=" + secret + " sslmode=verify-full",
		"host=db user=app password='" + secret + " x' sslmode=verify-full",
	} {
		c := pgconn.Config{URL: u, MaxConns: 3}
		var out bytes.Buffer
		for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
			fmt.Fprintf(&out, verb+"\n", c)
			fmt.Fprintf(&out, verb+"\n", &c)
		}
		slog.New(slog.NewJSONHandler(&out, nil)).Info("config", "db", c, "db_ptr", &c)
		if strings.Contains(out.String(), secret) {
			t.Fatalf("password printed for %q:\n%s", u, out.String())
		}
		if !strings.Contains(out.String(), "sslmode=verify-full") {
			t.Fatalf("settings lost for %q:\n%s", u, out.String())
		}
	}
}
