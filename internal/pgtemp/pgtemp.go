// Package pgtemp runs a throwaway PostgreSQL cluster from the machine's
// server binaries: initdb into a temporary directory, pg_ctl start on a free
// loopback port, and removal of everything on Stop. `make demo` uses it so
// that a new user needs no database of their own.
//
// PostgreSQL refuses to run as root; when the process is root the server runs
// as the `postgres` system user (through runuser).
package pgtemp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Cluster is a running throwaway cluster.
type Cluster struct {
	// URL connects to database "postgres" as superuser "postgres".
	URL string
	// Port is the loopback TCP port the server listens on.
	Port int
	dir  string
	bin  string
	asPG bool
	opts string // the server options given to pg_ctl start
	dog  *exec.Cmd
}

// BinDir finds the directory holding initdb and pg_ctl: the newest
// /usr/lib/postgresql/*/bin, else the one on PATH.
func BinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("initdb not found: install the Debian package 'postgresql' (apt-get install -y postgresql)")
}

func version(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

// Options configures StartWithOptions.
type Options struct {
	// SSLCertFile and SSLKeyFile, when both set, turn on ssl=on with this
	// PEM server certificate (chain) and private key (default: no TLS). The
	// files are copied into the cluster's directory, readable by the server
	// only.
	SSLCertFile string
	SSLKeyFile  string
	// Settings are extra server settings, name to value (e.g.
	// "max_connections": "300"); default none.
	Settings map[string]string
	// StopWithProcess starts a watchdog that stops the server and removes
	// its files if this process dies without calling Stop (a crashed soak
	// must not leave a server behind); default off.
	StopWithProcess bool
}

// Start creates and starts a cluster. Stop removes it.
func Start(ctx context.Context) (*Cluster, error) {
	return StartWithOptions(ctx, Options{})
}

// StartWithOptions creates and starts a cluster configured by o. Stop
// removes it.
func StartWithOptions(ctx context.Context, o Options) (*Cluster, error) {
	if (o.SSLCertFile == "") != (o.SSLKeyFile == "") {
		return nil, errors.New("pgtemp: SSLCertFile and SSLKeyFile go together")
	}
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	c, err := newCluster(ctx, bin)
	if err != nil {
		return nil, err
	}
	port := c.Port
	data := filepath.Join(c.dir, "data")
	if out, err := c.run(ctx, "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8"); err != nil {
		_ = os.RemoveAll(c.dir)
		return nil, fmt.Errorf("initdb: %v: %s", err, lastLines(out, 5))
	}
	opts := c.baseOpts()
	if o.SSLCertFile != "" {
		crt, key, err := c.installTLS(ctx, o.SSLCertFile, o.SSLKeyFile)
		if err != nil {
			_ = os.RemoveAll(c.dir)
			return nil, err
		}
		opts += fmt.Sprintf(" -c ssl=on -c ssl_cert_file=%s -c ssl_key_file=%s", crt, key)
	}
	names := make([]string, 0, len(o.Settings))
	for k := range o.Settings {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		opts += fmt.Sprintf(" -c %s=%s", k, o.Settings[k])
	}
	c.opts = opts
	if err := c.StartServer(ctx); err != nil {
		_ = os.RemoveAll(c.dir)
		return nil, err
	}
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	if o.StopWithProcess {
		if err := c.startWatchdog(); err != nil {
			_ = c.Stop()
			return nil, err
		}
	}
	return c, nil
}

// newCluster makes the directory of a cluster (owned by the server's user)
// and picks its port.
func newCluster(ctx context.Context, bin string) (*Cluster, error) {
	c := &Cluster{bin: bin, asPG: os.Geteuid() == 0}
	if c.asPG {
		if _, err := user.Lookup("postgres"); err != nil {
			return nil, errors.New("running as root but user 'postgres' does not exist: install the Debian package 'postgresql' or run as a normal user")
		}
	}
	var err error
	c.dir, err = os.MkdirTemp("", "onceflow-demo-pg-")
	if err != nil {
		return nil, err
	}
	if c.asPG {
		if err := os.Chmod(c.dir, 0o755); err != nil {
			return nil, err
		}
		if out, err := exec.CommandContext(ctx, "chown", "postgres", c.dir).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("chown %s: %v: %s", c.dir, err, out)
		}
	}
	if c.Port, err = freePort(); err != nil {
		return nil, err
	}
	return c, nil
}

// baseOpts are the server options every cluster starts with.
func (c *Cluster) baseOpts() string {
	return fmt.Sprintf("-c listen_addresses=127.0.0.1 -c port=%d -c unix_socket_directories=%s -c max_connections=200", c.Port, c.dir)
}

// startWatchdog runs a shell that waits for this process to die, then
// stops the server and removes its directory. Stop kills the watchdog.
func (c *Cluster) startWatchdog() error {
	stop := fmt.Sprintf("%q -D %q -m immediate stop", filepath.Join(c.bin, "pg_ctl"), filepath.Join(c.dir, "data"))
	if c.asPG {
		stop = "runuser -u postgres -- " + stop
	}
	script := fmt.Sprintf("while kill -0 %d 2>/dev/null; do sleep 1; done; %s >/dev/null 2>&1; rm -rf %q", os.Getpid(), stop, c.dir)
	cmd := exec.Command("sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgtemp watchdog: %w", err)
	}
	go func() { _ = cmd.Wait() }()
	c.dog = cmd
	return nil
}

// installTLS copies the server certificate and key into the cluster
// directory, owned by the server's user; the key is mode 0600 as PostgreSQL
// requires.
func (c *Cluster) installTLS(ctx context.Context, certFile, keyFile string) (crt, key string, err error) {
	crt, key = filepath.Join(c.dir, "server.crt"), filepath.Join(c.dir, "server.key")
	for src, dst := range map[string]string{certFile: crt, keyFile: key} {
		b, err := os.ReadFile(src)
		if err != nil {
			return "", "", fmt.Errorf("pgtemp: %w", err)
		}
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			return "", "", fmt.Errorf("pgtemp: %w", err)
		}
		if c.asPG {
			if out, err := exec.CommandContext(ctx, "chown", "postgres", dst).CombinedOutput(); err != nil {
				return "", "", fmt.Errorf("chown %s: %v: %s", dst, err, out)
			}
		}
	}
	return crt, key, nil
}

// StopServer stops the server and keeps its data: mode is pg_ctl's
// shutdown mode, "fast" (clean) or "immediate" (no checkpoint: the next
// start runs crash recovery, as after a power cut of the server process).
func (c *Cluster) StopServer(ctx context.Context, mode string) error {
	if out, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.dir, "data"), "-m", mode, "-w", "-t", "60", "stop"); err != nil {
		return fmt.Errorf("pg_ctl stop -m %s: %v: %s", mode, err, lastLines(out, 5))
	}
	return nil
}

// StartServer starts the (stopped) server again on the same port and data,
// waiting until it accepts connections.
func (c *Cluster) StartServer(ctx context.Context) error {
	data := filepath.Join(c.dir, "data")
	if out, err := c.run(ctx, "pg_ctl", "-D", data, "-l", filepath.Join(c.dir, "postgres.log"), "-o", c.opts, "-w", "-t", "60", "start"); err != nil {
		return fmt.Errorf("pg_ctl start: %v: %s", err, lastLines(out, 5))
	}
	return nil
}

// Dir is where data and the server log live.
func (c *Cluster) Dir() string { return c.dir }

// Stop shuts the server down and removes its files.
func (c *Cluster) Stop() error {
	if c.dog != nil {
		_ = syscall.Kill(-c.dog.Process.Pid, syscall.SIGKILL)
		c.dog = nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.dir, "data"), "-m", "fast", "-w", "stop")
	if err != nil {
		_, _ = c.run(ctx, "pg_ctl", "-D", filepath.Join(c.dir, "data"), "-m", "immediate", "stop")
	}
	return errors.Join(err, os.RemoveAll(c.dir))
}

func (c *Cluster) run(ctx context.Context, tool string, args ...string) (string, error) {
	path := filepath.Join(c.bin, tool)
	var cmd *exec.Cmd
	if c.asPG {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
