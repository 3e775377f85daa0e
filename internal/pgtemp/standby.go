package pgtemp

// Streaming replication for the soak's switchover: a standby made with
// pg_basebackup -R, promoted with pg_ctl promote, and a former primary
// made the new standby with pg_rewind (or, when that fails, a fresh base
// backup). Primary and standby start with the same server settings; the
// primary needs wal_log_hints=on for pg_rewind (StandbySettings).

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbySettings are the server settings a primary needs for StartStandby
// and Rebuild: hint bits WAL-logged (pg_rewind), and WAL kept for a
// standby that is being rebuilt.
func StandbySettings() map[string]string {
	return map[string]string{"wal_log_hints": "on", "wal_keep_size": "2GB", "hot_standby": "on"}
}

// StartStandby makes a streaming standby of c: pg_basebackup (WAL
// streamed, recovery configuration written) into a new directory, started
// on a port of its own with c's server options. Stop removes it.
func (c *Cluster) StartStandby(ctx context.Context, o Options) (*Cluster, error) {
	s, err := newCluster(ctx, c.bin)
	if err != nil {
		return nil, err
	}
	if err := s.baseBackup(ctx, c); err != nil {
		_ = os.RemoveAll(s.dir)
		return nil, err
	}
	s.opts = strings.Replace(c.opts, c.baseOpts(), s.baseOpts(), 1)
	if err := s.StartServer(ctx); err != nil {
		_ = os.RemoveAll(s.dir)
		return nil, err
	}
	s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.Port)
	if o.StopWithProcess {
		if err := s.startWatchdog(); err != nil {
			_ = s.Stop()
			return nil, err
		}
	}
	return s, nil
}

// baseBackup fills s's (empty or missing) data directory from primary and
// makes it primary's standby.
func (s *Cluster) baseBackup(ctx context.Context, primary *Cluster) error {
	data := filepath.Join(s.dir, "data")
	if err := os.RemoveAll(data); err != nil {
		return err
	}
	if out, err := s.run(ctx, "pg_basebackup", "-D", data, "-h", "127.0.0.1", "-p", strconv.Itoa(primary.Port),
		"-U", "postgres", "-X", "stream", "-c", "fast", "-R"); err != nil {
		return fmt.Errorf("pg_basebackup: %v: %s", err, lastLines(out, 5))
	}
	return s.follow(primary)
}

// follow makes s (stopped) a standby of primary: standby.signal and
// primary_conninfo (appended: the last setting in the file wins, and
// pg_rewind copies the source's postgresql.auto.conf, which names another
// primary).
func (s *Cluster) follow(primary *Cluster) error {
	data := filepath.Join(s.dir, "data")
	if err := s.writeFile(filepath.Join(data, "standby.signal"), ""); err != nil {
		return err
	}
	auto := filepath.Join(data, "postgresql.auto.conf")
	b, err := os.ReadFile(auto)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	conf := string(b) + fmt.Sprintf("\nprimary_conninfo = 'host=127.0.0.1 port=%d user=postgres application_name=standby'\n", primary.Port)
	return s.writeFile(auto, conf)
}

// writeFile writes a file of the data directory, owned by the server's
// user.
func (s *Cluster) writeFile(path, content string) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return err
	}
	if s.asPG {
		if err := os.Chown(path, pgUID(), -1); err != nil {
			return err
		}
	}
	return nil
}

// Promote ends recovery on a standby (pg_ctl promote, waiting until it
// accepts writes).
func (c *Cluster) Promote(ctx context.Context) error {
	if out, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.dir, "data"), "-w", "-t", "60", "promote"); err != nil {
		return fmt.Errorf("pg_ctl promote: %v: %s", err, lastLines(out, 5))
	}
	return nil
}

// Rebuild makes c, a stopped former primary, the standby of primary and
// starts it, and says how. After a clean switchover the former primary's
// WAL ends at its shutdown checkpoint, which the new primary replayed
// before its promotion: it can follow as it is, so that is tried first.
// Then pg_rewind, then a fresh base backup, each until the standby
// streams from primary (pg_stat_wal_receiver).
func (c *Cluster) Rebuild(ctx context.Context, primary *Cluster) (string, error) {
	var tried []string
	attempt := func(how string, prepare func() error) bool {
		err := prepare()
		if err == nil {
			err = c.follow(primary)
		}
		if err == nil {
			err = c.StartServer(ctx)
		}
		if err == nil {
			err = c.WaitStreaming(ctx, 30*time.Second)
		}
		if err == nil {
			return true
		}
		tried = append(tried, fmt.Sprintf("%s: %v", how, err))
		_ = c.StopServer(ctx, "immediate")
		return false
	}
	if attempt("as it is", func() error { return nil }) {
		return "following as it was", nil
	}
	if attempt("pg_rewind", func() error {
		out, err := c.run(ctx, "pg_rewind", "-D", filepath.Join(c.dir, "data"),
			"--source-server", fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres", primary.Port))
		if err != nil {
			return fmt.Errorf("%v: %s", err, lastLines(out, 2))
		}
		return nil
	}) {
		return fmt.Sprintf("pg_rewind (%s)", strings.Join(tried, "; ")), nil
	}
	if attempt("pg_basebackup", func() error { return c.baseBackup(ctx, primary) }) {
		return fmt.Sprintf("pg_basebackup (%s)", strings.Join(tried, "; ")), nil
	}
	return "", fmt.Errorf("no standby: %s", strings.Join(tried, "; "))
}

// WaitStreaming waits until c, a standby, streams WAL from its primary.
func (c *Cluster) WaitStreaming(ctx context.Context, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port)
	var last error
	for {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			var status string
			err = conn.QueryRow(ctx, `SELECT coalesce((SELECT status FROM pg_stat_wal_receiver), 'no WAL receiver')`).Scan(&status)
			conn.Close(context.WithoutCancel(ctx))
			if err == nil && status == "streaming" {
				return nil
			}
			if err == nil {
				err = fmt.Errorf("WAL receiver %s", status)
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("not streaming within %s: %v (server log: %s)", limit, last, lastLines(c.logTail(), 2))
		case <-time.After(200 * time.Millisecond): // polling the standby
		}
	}
}

// logTail is the end of the server's log.
func (c *Cluster) logTail() string {
	b, err := os.ReadFile(filepath.Join(c.dir, "postgres.log"))
	if err != nil {
		return ""
	}
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}

// CheckpointLSN is the "Latest checkpoint location" of a stopped cluster
// (pg_controldata): after a clean shutdown, the shutdown checkpoint, the
// last record the server wrote.
func (c *Cluster) CheckpointLSN(ctx context.Context) (string, error) {
	out, err := c.run(ctx, "pg_controldata", "-D", filepath.Join(c.dir, "data"))
	if err != nil {
		return "", fmt.Errorf("pg_controldata: %v: %s", err, lastLines(out, 3))
	}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "Latest checkpoint location" {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("pg_controldata: no latest checkpoint location in %q", lastLines(out, 3))
}

// pgUID is the uid of the postgres system user (the server's owner when
// this process is root), 0 if unknown.
func pgUID() int {
	u, err := user.Lookup("postgres")
	if err != nil {
		return 0
	}
	id, _ := strconv.Atoi(u.Uid)
	return id
}
