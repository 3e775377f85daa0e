package k8s_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/onceflow/onceflow/internal/testkit"
)

func needServices(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: this test runs the real binaries against PostgreSQL and Kafka")
	}
}

// flagSet is what a subcommand's -help says about its flags.
type flagSet struct {
	// Source is the command line the flags were read from.
	Source string
	// Defaults by flag name ("" when none is printed).
	Defaults map[string]string
	// Env maps each ONCEFLOW_* variable to its flag.
	Env map[string]string
	// Required flags (their usage says "(required)").
	Required []string
	// Usage by flag name: the help text printed under it.
	Usage map[string]string
}

// flagLine is cli.Usage's format: "  -name  [$ENV] (default "x")", or
// "[flag only]" for a flag that reads no environment variable, then the
// usage on the next line.
var flagLine = regexp.MustCompile(`^\s+-([a-z0-9][a-z0-9-]*)\s+(?:\[\$(ONCEFLOW_[A-Z0-9_]+)\]|\[flag only\])(?: \(default (".*")\))?\s*$`)

func parseFlags(source, out string) flagSet {
	fs := flagSet{Source: source, Defaults: map[string]string{}, Env: map[string]string{}, Usage: map[string]string{}}
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		m := flagLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		def := ""
		if m[3] != "" {
			if u, err := strconv.Unquote(m[3]); err == nil {
				def = u
			}
		}
		fs.Defaults[m[1]] = def
		if m[2] != "" {
			fs.Env[m[2]] = m[1]
		}
		if i+1 < len(lines) {
			fs.Usage[m[1]] = strings.TrimSpace(lines[i+1])
			if strings.Contains(lines[i+1], "(required)") {
				fs.Required = append(fs.Required, m[1])
			}
		}
	}
	return fs
}

var (
	helpMu    sync.Mutex
	helpCache = map[string]flagSet{}
)

// binaryFlags runs `bin sub… -help` on the real binary and parses the flags
// it prints. For `relay run`, whose -help printed nothing when this was
// written, it falls back to `relay help` and logs that.
func binaryFlags(t *testing.T, bin string, sub []string) flagSet {
	t.Helper()
	key := bin + " " + strings.Join(sub, " ")
	helpMu.Lock()
	defer helpMu.Unlock()
	if fs, ok := helpCache[key]; ok {
		return fs
	}
	path := testkit.Binary(t, bin)
	help := func(args ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
		if ctx.Err() != nil {
			t.Fatalf("%s %s: %v", bin, strings.Join(args, " "), ctx.Err())
		}
		_ = err // -help may exit 0 or 2; the output is what counts
		return string(out)
	}
	args := append(slices.Clone(sub), "-help")
	source := bin + " " + strings.Join(args, " ")
	fs := parseFlags(source, help(args...))
	if len(fs.Env) == 0 && bin == "relay" && slices.Equal(sub, []string{"run"}) {
		t.Logf("NOTE: `%s` prints no flags; reading them from `relay help`", source)
		fs = parseFlags("relay help", help("help"))
	}
	helpCache[key] = fs
	return fs
}

// container is one container of a rendered overlay.
type container struct {
	Where string // overlay: kind/name container c
	Pod   *corev1.PodSpec
	C     *corev1.Container
	Env   map[string]string
}

func containers(t *testing.T, dir string) []container {
	t.Helper()
	m := build(t, dir)
	var out []container
	for _, key := range keys(m.podSpecs()) {
		pod := m.podSpecs()[key]
		for i := range pod.Spec.Containers {
			c := &pod.Spec.Containers[i]
			out = append(out, container{
				Where: fmt.Sprintf("%s: %s container %s", dir, key, c.Name),
				Pod:   &pod.Spec, C: c, Env: containerEnv(m, c),
			})
		}
	}
	return out
}

// command splits a container's command and args into binary, subcommand
// words and flag arguments.
func command(c *corev1.Container) (bin string, sub, flags []string) {
	if len(c.Command) == 0 {
		return "", nil, nil
	}
	bin = filepath.Base(c.Command[0])
	all := append(slices.Clone(c.Command[1:]), c.Args...)
	for i, a := range all {
		if strings.HasPrefix(a, "-") {
			return bin, all[:i], all[i:]
		}
	}
	return bin, all, nil
}

// TestManifestFlagsMatchBinaries checks every name the manifests share with
// the binaries against the binaries' own -help: each ONCEFLOW_* variable a
// container gets (env and envFrom ConfigMaps) and each flag in its args is a
// flag of that subcommand, required flags are set, the HTTP port the probes
// and Services use is the one the binary listens on, and the handlers file
// is mounted. Renaming a flag in a binary fails this test.
func TestManifestFlagsMatchBinaries(t *testing.T) {
	needServices(t)
	t.Parallel()
	for _, dir := range overlays {
		for _, ct := range containers(t, dir) {
			bin, sub, args := command(ct.C)
			if bin != "relay" && bin != "consumer" {
				t.Errorf("%s runs %v, want /usr/local/bin/relay or /usr/local/bin/consumer", ct.Where, ct.C.Command)
				continue
			}
			if len(sub) == 0 {
				t.Errorf("%s runs %s without a subcommand", ct.Where, bin)
				continue
			}
			fs := binaryFlags(t, bin, sub)
			if len(fs.Env) == 0 {
				if sub[0] == "migrate" {
					// migrate's -help prints nothing (internal/migrate);
					// TestMigrateJobAgainstEmptyDatabase runs it instead.
					t.Logf("NOTE: `%s` prints no flags; %s is checked by running it", fs.Source, ct.Where)
					continue
				}
				t.Errorf("%s: `%s` printed no flags in the `-flag  [$ONCEFLOW_…]` format of cli.Usage", ct.Where, fs.Source)
				continue
			}
			for _, name := range keys(ct.Env) {
				if strings.HasPrefix(name, "ONCEFLOW_") && fs.Env[name] == "" {
					t.Errorf("%s sets %s, which is no flag of `%s %s` (its variables: %v)", ct.Where, name, bin, strings.Join(sub, " "), keys(fs.Env))
				}
			}
			for _, a := range args {
				name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
				if _, ok := fs.Defaults[name]; !ok && strings.HasPrefix(a, "-") {
					t.Errorf("%s passes %s, which is no flag of `%s %s`", ct.Where, a, bin, strings.Join(sub, " "))
				}
			}
			for _, req := range fs.Required {
				env := "ONCEFLOW_" + strings.ToUpper(strings.ReplaceAll(req, "-", "_"))
				if ct.Env[env] == "" && !slices.ContainsFunc(args, func(a string) bool {
					return strings.TrimLeft(a, "-") == req || strings.HasPrefix(strings.TrimLeft(a, "-"), req+"=")
				}) {
					t.Errorf("%s does not set the required -%s (%s)", ct.Where, req, env)
				}
			}
			if def, ok := fs.Defaults["http-addr"]; ok && sub[0] == "run" {
				addr := def
				if v, ok := ct.Env["ONCEFLOW_HTTP_ADDR"]; ok {
					addr = v
				}
				checkHTTPPort(t, ct, addr)
			}
			if path := ct.Env["ONCEFLOW_HANDLERS_FILE"]; path != "" {
				checkMounted(t, build(t, dir), ct, path)
			}
		}
	}
}

func checkHTTPPort(t *testing.T, ct container, addr string) {
	t.Helper()
	i := strings.LastIndex(addr, ":")
	port, err := strconv.Atoi(addr[i+1:])
	if i < 0 || err != nil {
		t.Errorf("%s: HTTP address %q has no port", ct.Where, addr)
		return
	}
	var named string
	for _, p := range ct.C.Ports {
		if int(p.ContainerPort) == port {
			named = p.Name
		}
	}
	if named == "" {
		t.Errorf("%s listens on %d (http-addr %q) but declares ports %v", ct.Where, port, addr, ct.C.Ports)
		return
	}
	for name, p := range map[string]*corev1.Probe{"liveness": ct.C.LivenessProbe, "readiness": ct.C.ReadinessProbe, "startup": ct.C.StartupProbe} {
		if p == nil || p.HTTPGet == nil {
			continue
		}
		if got := p.HTTPGet.Port.String(); got != named && got != strconv.Itoa(port) {
			t.Errorf("%s: %s probe targets port %s, the binary listens on %d (%s)", ct.Where, name, got, port, named)
		}
	}
}

func checkMounted(t *testing.T, m *manifests, ct container, path string) {
	t.Helper()
	for _, vm := range ct.C.VolumeMounts {
		rel, err := filepath.Rel(vm.MountPath, path)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue
		}
		for _, v := range ct.Pod.Volumes {
			if v.Name != vm.Name || v.ConfigMap == nil {
				continue
			}
			cm := m.ConfigMaps[v.ConfigMap.Name]
			if cm == nil {
				t.Errorf("%s: volume %s names ConfigMap %s, which is not in the build", ct.Where, v.Name, v.ConfigMap.Name)
				return
			}
			if _, ok := cm.Data[rel]; !ok {
				t.Errorf("%s: %s is mounted from ConfigMap %s, which has no key %q", ct.Where, path, cm.Name, rel)
			}
			return
		}
	}
	t.Errorf("%s: %s is not inside a ConfigMap volume mount", ct.Where, path)
}

// resolveEnv turns a container's environment into what the test process
// passes to the binary: literal values as they are, references and
// test-specific values through refs (by variable name; refs may add
// variables); an unknown reference fails the test.
func resolveEnv(t *testing.T, ct container, refs map[string]string) []string {
	t.Helper()
	var env []string
	for _, name := range keys(ct.Env) {
		v := ct.Env[name]
		if r, ok := refs[name]; ok {
			v = r
		} else if v == "<ref>" {
			t.Fatalf("%s: the test has no value for the reference %s", ct.Where, name)
		}
		env = append(env, name+"="+v)
	}
	for _, name := range keys(refs) {
		if _, ok := ct.Env[name]; !ok {
			env = append(env, name+"="+refs[name])
		}
	}
	return env
}

func findContainer(t *testing.T, dir, where string) container {
	t.Helper()
	for _, ct := range containers(t, dir) {
		if strings.Contains(ct.Where, where) {
			return ct
		}
	}
	t.Fatalf("%s: no container of %s", dir, where)
	return container{}
}

// TestMigrateJobAgainstEmptyDatabase runs the migrate Job's command with
// the Job's environment (its Secret reference pointed at an empty test
// database) and checks that the schema is there afterwards.
func TestMigrateJobAgainstEmptyDatabase(t *testing.T) {
	needServices(t)
	t.Parallel()
	ct := findContainer(t, "overlays/prod", "Job/onceflow-migrate")
	db := testkit.EmptyDB(t)
	bin, sub, args := command(ct.C)
	env := resolveEnv(t, ct, map[string]string{"ONCEFLOW_DATABASE_URL": db.URL})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testkit.Binary(t, bin), append(sub, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v with the Job's environment: %v\n%s", bin, append(sub, args...), err, out)
	}
	var reg *string
	if err := db.Pool.QueryRow(ctx, "SELECT to_regclass('onceflow.outbox')::text").Scan(&reg); err != nil || reg == nil {
		t.Fatalf("after the migrate Job's command, onceflow.outbox does not exist (%v); output:\n%s", err, out)
	}
}

var httpListening = regexp.MustCompile(`"msg":"http listening".*"addr":"([^"]+)"`)

// startFromManifest runs the binary of container ct as the manifests do,
// with its environment resolved through refs and its HTTP server on a free
// loopback port, and returns the base URL of that server.
//
// When the manifest turns the admin API on, its token file (a Secret volume
// in the cluster) is a test file and it listens on a free loopback port;
// the API must then refuse a request without the token and answer one with
// it.
func startFromManifest(t *testing.T, ct container, refs map[string]string) (*testkit.Proc, string) {
	t.Helper()
	bin, sub, args := command(ct.C)
	refs["ONCEFLOW_HTTP_ADDR"] = "127.0.0.1:0"
	const adminToken = "manifest-test-admin-token-5d2c"
	adminOn := ct.Env["ONCEFLOW_ADMIN"] == "true"
	if adminOn {
		tokens := filepath.Join(t.TempDir(), "tokens")
		if err := os.WriteFile(tokens, []byte("k8s-test "+adminToken+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		refs["ONCEFLOW_ADMIN_TOKEN_FILE"] = tokens
		refs["ONCEFLOW_ADMIN_ADDR"] = "127.0.0.1:0"
	}
	if ct.Env["ONCEFLOW_KAFKA_TLS"] == "true" {
		// The test's broker is the shared plaintext one. The overlay's
		// SASL_SSL settings are checked by TestProdOverlayEncrypts, and the
		// binaries' SASL_SSL against a real broker by itest/security.
		for _, k := range []string{"ONCEFLOW_KAFKA_TLS_CA_FILE", "ONCEFLOW_KAFKA_SASL_MECHANISM", "ONCEFLOW_KAFKA_SASL_USER", "ONCEFLOW_KAFKA_SASL_PASSWORD_FILE"} {
			refs[k] = ""
		}
		refs["ONCEFLOW_KAFKA_TLS"] = "false"
	}
	client, scheme := http.DefaultClient, "http"
	if ct.Env["ONCEFLOW_ADMIN_TLS_CERT_FILE"] != "" {
		// The admin API over TLS, with a key pair of a test CA in place of
		// the Secret's.
		ca, err := testkit.NewTestCA("k8s test CA")
		if err != nil {
			t.Fatal(err)
		}
		certPEM, keyPEM, err := ca.Issue("onceflow admin", "127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		refs["ONCEFLOW_ADMIN_TLS_CERT_FILE"], refs["ONCEFLOW_ADMIN_TLS_KEY_FILE"] = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
		if err := os.WriteFile(refs["ONCEFLOW_ADMIN_TLS_CERT_FILE"], certPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(refs["ONCEFLOW_ADMIN_TLS_KEY_FILE"], keyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(ca.CertPEM)
		client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
		scheme = "https"
	}
	env := resolveEnv(t, ct, refs)
	p := testkit.Start(t, bin, testkit.Binary(t, bin), env, append(sub, args...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	line, err := p.WaitFor(ctx, httpListening)
	if err != nil {
		t.Fatalf("%s: %v\noutput:\n%s", ct.Where, err, p.Output())
	}
	if adminOn {
		aline, err := p.WaitFor(ctx, adminListening)
		if err != nil {
			t.Fatalf("%s: the admin API did not start: %v\noutput:\n%s", ct.Where, err, p.Output())
		}
		url := scheme + "://" + adminListening.FindStringSubmatch(aline)[1] + "/api/v1/session"
		for _, c := range []struct {
			token string
			want  int
		}{{"", http.StatusUnauthorized}, {"wrong-" + adminToken, http.StatusUnauthorized}, {adminToken, http.StatusOK}} {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if c.token != "" {
				req.Header.Set("Authorization", "Bearer "+c.token)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("%s: admin API: %v", ct.Where, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.want || (c.want == http.StatusOK && !strings.Contains(string(b), `"binary":"`+bin+`"`)) {
				t.Errorf("%s: admin API with token %q: %d %s, want %d", ct.Where, c.token, resp.StatusCode, b, c.want)
			}
		}
		// The relay status, as both binaries serve it; the relay adds its role.
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(url, "session")+"relay", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		if resp, err := client.Do(req); err != nil {
			t.Errorf("%s: admin API relay status: %v", ct.Where, err)
		} else {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"pending_rows"`) || (bin == "relay") != strings.Contains(string(b), `"self":{"role":`) {
				t.Errorf("%s: admin API relay status: %d %s", ct.Where, resp.StatusCode, b)
			}
		}
		if strings.Contains(p.Output(), adminToken) {
			t.Errorf("%s: the admin token appears in the output", ct.Where)
		}
	}
	return p, "http://" + httpListening.FindStringSubmatch(line)[1]
}

var adminListening = regexp.MustCompile(`"msg":"admin listening".*"addr":"([^"]+)"`)

// getUntil polls url until ok(status, body) or the deadline; it returns the
// last body.
func getUntil(ctx context.Context, url string, ok func(int, string) bool) (string, error) {
	var last string
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = string(b)
			if ok(resp.StatusCode, last) {
				return last, nil
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("GET %s: %w; last answer: %.500s", url, ctx.Err(), last)
		case <-time.After(wait):
		}
	}
}

// families is the set of metric family names in a text exposition.
func families(body string) map[string]bool {
	out := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
			out[f[2]] = true
		}
	}
	return out
}

// metricValue sums the samples of name (any labels) in a text exposition.
func metricValue(body, name string) (float64, bool) {
	var sum float64
	found := false
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name) || (len(l) > len(name) && l[len(name)] != ' ' && l[len(name)] != '{') {
			continue
		}
		f := strings.Fields(l)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
			found = true
		}
	}
	return sum, found
}

// TestAlertMetricsExportedByBinaries runs the real relay and consumer with
// the prod overlay's settings (brokers, database and topic pointed at the
// test services), checks /healthz and /readyz, moves one event through
// outbox → relay → Kafka → consumer, then scrapes /metrics and checks that
// every metric an alert uses is exported.
func TestAlertMetricsExportedByBinaries(t *testing.T) {
	needServices(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	db := testkit.NewDB(t)
	brokers := testkit.KafkaBrokers(t)
	topic := testkit.Topic(t, "deploy", 2, nil)
	ckpt := testkit.Topic(t, "deploy-ckpt", 1, map[string]*string{"cleanup.policy": testkit.StringPtr("compact")})

	relayCt := findContainer(t, "overlays/prod", "Deployment/onceflow-relay")
	_, relayURL := startFromManifest(t, relayCt, map[string]string{
		"ONCEFLOW_DATABASE_URL":            db.URL,
		"ONCEFLOW_KAFKA_BROKERS":           brokers,
		"ONCEFLOW_HOLDER_ID":               "onceflow-relay-test-0",
		"ONCEFLOW_CHECKPOINT_TOPIC":        ckpt,
		"ONCEFLOW_TRANSACTIONAL_ID_PREFIX": "deploy-" + topic + "-",
	})

	consumerCt := findContainer(t, "overlays/prod", "Deployment/onceflow-consumer")
	m := build(t, "overlays/prod")
	handlers := filepath.Join(t.TempDir(), "handlers.json")
	if err := os.WriteFile(handlers, []byte(m.ConfigMaps["onceflow-handlers"].Data["handlers.json"]), 0o644); err != nil {
		t.Fatal(err)
	}
	_, consumerURL := startFromManifest(t, consumerCt, map[string]string{
		"ONCEFLOW_DATABASE_URL":  db.URL,
		"ONCEFLOW_KAFKA_BROKERS": brokers,
		"ONCEFLOW_TOPICS":        topic,
		"ONCEFLOW_GROUP":         "deploy-" + topic,
		"ONCEFLOW_HANDLERS_FILE": handlers,
	})

	for _, u := range []string{relayURL, consumerURL} {
		if _, err := getUntil(ctx, u+"/healthz", func(code int, _ string) bool { return code == 200 }); err != nil {
			t.Fatalf("liveness probe path: %v", err)
		}
		if _, err := getUntil(ctx, u+"/readyz", func(code int, _ string) bool { return code == 200 }); err != nil {
			t.Fatalf("readiness probe path: %v", err)
		}
	}

	if _, err := db.Pool.Exec(ctx, `SELECT * FROM onceflow.enqueue($1, 'deploy-source', 'deploy.test', '{"n":1}'::jsonb)`, topic); err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	relayMetrics, err := getUntil(ctx, relayURL+"/metrics", func(code int, body string) bool {
		v, _ := metricValue(body, "onceflow_relay_published_total")
		return code == 200 && v >= 1
	})
	if err != nil {
		t.Fatalf("relay never published the event: %v", err)
	}
	consumerMetrics, err := getUntil(ctx, consumerURL+"/metrics", func(code int, body string) bool {
		v, _ := metricValue(body, "onceflow_consumer_processed_total")
		return code == 200 && v >= 1
	})
	if err != nil {
		t.Fatalf("consumer never processed the event: %v", err)
	}

	exported := families(relayMetrics)
	for f := range families(consumerMetrics) {
		exported[f] = true
	}
	_, rules := rulesFile(t)
	var missing []string
	for name, alerts := range ruleMetrics(rules) {
		if name == "up" { // made by Prometheus for every target
			continue
		}
		if !exported[name] {
			missing = append(missing, fmt.Sprintf("%s (used by %s)", name, strings.Join(alerts, ", ")))
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		var have []string
		for f := range exported {
			if strings.HasPrefix(f, "onceflow_") {
				have = append(have, f)
			}
		}
		slices.Sort(have)
		t.Errorf("metrics used by alerts but not exported by the running binaries:\n  %s\nexported onceflow_ metrics:\n  %s",
			strings.Join(missing, "\n  "), strings.Join(have, "\n  "))
	}
}

var runbookCommand = regexp.MustCompile(`/usr/local/bin/(relay|consumer)((?:\s+[^\s|&;]+)*)`)

// TestRunbookCommandsExist: every `/usr/local/bin/relay …` or
// `/usr/local/bin/consumer …` command in docs/runbooks names a real
// subcommand (its -help prints flags) and only flags it has, so on-call
// never meets "unknown command" in the middle of an incident.
func TestRunbookCommandsExist(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("..", "..", "docs", "runbooks", "*.md"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no runbooks (%v)", err)
	}
	seen := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			for _, m := range runbookCommand.FindAllStringSubmatch(line, -1) {
				bin, words := m[1], strings.Fields(m[2])
				var sub, flags []string
				for i, w := range words {
					if !regexp.MustCompile(`^[a-z]+$`).MatchString(w) {
						for _, rest := range words[i:] {
							if strings.HasPrefix(rest, "-") {
								name, _, _ := strings.Cut(strings.TrimLeft(rest, "-"), "=")
								flags = append(flags, name)
							}
						}
						break
					}
					sub = append(sub, w)
				}
				if len(sub) == 0 {
					continue
				}
				seen++
				fs := binaryFlags(t, bin, sub)
				if len(fs.Env) == 0 {
					t.Errorf("%s: `%s %s` is not a command of the binary (its -help prints no flags)", filepath.Base(f), bin, strings.Join(sub, " "))
					continue
				}
				for _, fl := range flags {
					if _, ok := fs.Defaults[fl]; !ok {
						t.Errorf("%s: `%s %s` has no flag -%s", filepath.Base(f), bin, strings.Join(sub, " "), fl)
					}
				}
			}
		}
	}
	if seen == 0 {
		t.Error("no /usr/local/bin/relay or /usr/local/bin/consumer command found in the runbooks")
	}
}
