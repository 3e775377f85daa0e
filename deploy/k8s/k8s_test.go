// Package k8s_test checks the Kubernetes manifests, the Dockerfile and the
// alert rules in deploy/k8s: strict decoding into the Kubernetes Go types,
// in-process kustomize builds of every overlay, the deployment policies the
// on-call relies on, and (binaries_test.go, alerts_test.go) the names they
// share with the real binaries and with Prometheus.
package k8s_test

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
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

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/relay"
	"github.com/onceflow/onceflow/pkg/retention"
)

// overlays are the kustomize targets users apply.
var overlays = []string{"overlays/dev", "overlays/prod"}

// manifests is one decoded set of objects (a directory or a build output).
type manifests struct {
	ConfigMaps      map[string]*corev1.ConfigMap
	Deployments     map[string]*appsv1.Deployment
	Jobs            map[string]*batchv1.Job
	CronJobs        map[string]*batchv1.CronJob
	NetworkPolicies map[string]*networkingv1.NetworkPolicy
	PDBs            map[string]*policyv1.PodDisruptionBudget
	PrometheusRules map[string]*monitoringv1.PrometheusRule
	Secrets         map[string]*corev1.Secret
	ServiceAccounts map[string]*corev1.ServiceAccount
	ServiceMonitors map[string]*monitoringv1.ServiceMonitor
	Services        map[string]*corev1.Service
	// Objects lists every object as kind/name, in input order.
	Objects []string
	// Namespaces of the namespaced objects, by kind/name.
	Namespaces map[string]string
}

func newManifests() *manifests {
	return &manifests{
		ConfigMaps: map[string]*corev1.ConfigMap{}, Deployments: map[string]*appsv1.Deployment{},
		Jobs: map[string]*batchv1.Job{}, CronJobs: map[string]*batchv1.CronJob{}, NetworkPolicies: map[string]*networkingv1.NetworkPolicy{},
		PDBs: map[string]*policyv1.PodDisruptionBudget{}, PrometheusRules: map[string]*monitoringv1.PrometheusRule{},
		Secrets: map[string]*corev1.Secret{}, ServiceAccounts: map[string]*corev1.ServiceAccount{},
		ServiceMonitors: map[string]*monitoringv1.ServiceMonitor{}, Services: map[string]*corev1.Service{},
		Namespaces: map[string]string{},
	}
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decode adds every YAML document of data (named where in errors) to m,
// decoded strictly: a field the Kubernetes type does not have, a
// duplicate field or a wrong type is an error, as is an unknown kind.
func (m *manifests) decode(where string, data []byte) error {
	for i, doc := range docSeparator.Split(string(data), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return fmt.Errorf("%s: document %d: %v", where, i+1, err)
		}
		gvk := tm.APIVersion + "/" + tm.Kind
		var obj interface{ GetName() string }
		var ns func() string
		switch gvk {
		case "v1/ConfigMap":
			o := &corev1.ConfigMap{}
			obj, ns = o, o.GetNamespace
		case "v1/Secret":
			o := &corev1.Secret{}
			obj, ns = o, o.GetNamespace
		case "v1/Service":
			o := &corev1.Service{}
			obj, ns = o, o.GetNamespace
		case "v1/ServiceAccount":
			o := &corev1.ServiceAccount{}
			obj, ns = o, o.GetNamespace
		case "apps/v1/Deployment":
			o := &appsv1.Deployment{}
			obj, ns = o, o.GetNamespace
		case "batch/v1/Job":
			o := &batchv1.Job{}
			obj, ns = o, o.GetNamespace
		case "batch/v1/CronJob":
			o := &batchv1.CronJob{}
			obj, ns = o, o.GetNamespace
		case "policy/v1/PodDisruptionBudget":
			o := &policyv1.PodDisruptionBudget{}
			obj, ns = o, o.GetNamespace
		case "networking.k8s.io/v1/NetworkPolicy":
			o := &networkingv1.NetworkPolicy{}
			obj, ns = o, o.GetNamespace
		case "monitoring.coreos.com/v1/ServiceMonitor":
			o := &monitoringv1.ServiceMonitor{}
			obj, ns = o, o.GetNamespace
		case "monitoring.coreos.com/v1/PrometheusRule":
			o := &monitoringv1.PrometheusRule{}
			obj, ns = o, o.GetNamespace
		default:
			return fmt.Errorf("%s: document %d: kind %q of apiVersion %q is not one this test knows; add it to manifests.decode",
				where, i+1, tm.Kind, tm.APIVersion)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			return fmt.Errorf("%s: document %d (%s): strict decode into %T: %v", where, i+1, tm.Kind, obj, err)
		}
		name := obj.GetName()
		if name == "" {
			return fmt.Errorf("%s: document %d (%s) has no metadata.name", where, i+1, tm.Kind)
		}
		key := tm.Kind + "/" + name
		if slices.Contains(m.Objects, key) {
			return fmt.Errorf("%s: %s is defined twice", where, key)
		}
		m.Objects = append(m.Objects, key)
		m.Namespaces[key] = ns()
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			m.ConfigMaps[name] = o
		case *corev1.Secret:
			m.Secrets[name] = o
		case *corev1.Service:
			m.Services[name] = o
		case *corev1.ServiceAccount:
			m.ServiceAccounts[name] = o
		case *appsv1.Deployment:
			m.Deployments[name] = o
		case *batchv1.Job:
			m.Jobs[name] = o
		case *batchv1.CronJob:
			m.CronJobs[name] = o
		case *policyv1.PodDisruptionBudget:
			m.PDBs[name] = o
		case *networkingv1.NetworkPolicy:
			m.NetworkPolicies[name] = o
		case *monitoringv1.ServiceMonitor:
			m.ServiceMonitors[name] = o
		case *monitoringv1.PrometheusRule:
			m.PrometheusRules[name] = o
		}
	}
	return nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// podSpecs returns the pod templates of the workloads, by kind/name.
func (m *manifests) podSpecs() map[string]*corev1.PodTemplateSpec {
	out := map[string]*corev1.PodTemplateSpec{}
	for n, d := range m.Deployments {
		out["Deployment/"+n] = &d.Spec.Template
	}
	for n, j := range m.Jobs {
		out["Job/"+n] = &j.Spec.Template
	}
	for n, c := range m.CronJobs {
		out["CronJob/"+n] = &c.Spec.JobTemplate.Spec.Template
	}
	return out
}

var (
	buildMu    sync.Mutex
	buildCache = map[string]*manifests{}
)

// build runs `kustomize build dir` in process (krusty on the real
// filesystem) and decodes the output strictly.
func build(t *testing.T, dir string) *manifests {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if m, ok := buildCache[dir]; ok {
		return m
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatalf("kustomize build %s: render YAML: %v", dir, err)
	}
	m := newManifests()
	if err := m.decode("kustomize build "+dir, out); err != nil {
		t.Fatal(err)
	}
	buildCache[dir] = m
	return m
}

// TestManifestsDecodeStrictly decodes every YAML file under base/ into its
// Kubernetes Go type with unknown fields rejected, and checks that base's
// kustomization lists each of them.
func TestManifestsDecodeStrictly(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("base/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in base/ (%v)", err)
	}
	kust, err := os.ReadFile("base/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(kust, &k); err != nil {
		t.Fatalf("base/kustomization.yaml: %v", err)
	}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m := newManifests()
		if err := m.decode(f, data); err != nil {
			t.Error(err)
			continue
		}
		if len(m.Objects) == 0 {
			t.Errorf("%s holds no object", f)
		}
		if !slices.Contains(k.Resources, filepath.Base(f)) {
			t.Errorf("%s is not listed in base/kustomization.yaml resources, so no overlay applies it", f)
		}
	}
}

// TestStrictDecodeRejectsUnknownFields proves the decoder used above fails
// on a misspelt field instead of dropping it.
func TestStrictDecodeRejectsUnknownFields(t *testing.T) {
	t.Parallel()
	bad := []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replica: 2\n")
	if err := newManifests().decode("inline", bad); err == nil || !strings.Contains(err.Error(), "replica") {
		t.Fatalf("decode of a Deployment with spec.replica: got %v, want an unknown-field error naming it", err)
	}
	unknown := []byte("apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n")
	if err := newManifests().decode("inline", unknown); err == nil {
		t.Fatal("decode of an unexpected kind (Pod) succeeded, want an error")
	}
}

// TestOverlaysBuild runs kustomize build on base and each overlay and checks
// what every deployable set must hold.
func TestOverlaysBuild(t *testing.T) {
	t.Parallel()
	for _, dir := range append([]string{"base"}, overlays...) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			t.Parallel()
			m := build(t, dir)
			for _, want := range []string{
				"Deployment/onceflow-relay", "Deployment/onceflow-consumer", "Job/onceflow-migrate", "CronJob/onceflow-prune",
				"ServiceMonitor/onceflow", "PrometheusRule/onceflow", "NetworkPolicy/onceflow",
				"PodDisruptionBudget/onceflow-relay", "PodDisruptionBudget/onceflow-consumer",
				"Service/onceflow-relay-metrics", "Service/onceflow-consumer-metrics",
			} {
				if !slices.Contains(m.Objects, want) {
					t.Errorf("%s renders no %s (got %v)", dir, want, m.Objects)
				}
			}
			if r := m.Deployments["onceflow-relay"]; r != nil && (r.Spec.Replicas == nil || *r.Spec.Replicas != 2) {
				t.Errorf("%s: relay replicas = %v, want 2 (one leader, one standby)", dir, r.Spec.Replicas)
			}
			if dir == "base" {
				return
			}
			for key, ns := range m.Namespaces {
				if ns == "" {
					t.Errorf("%s: %s has no namespace", dir, key)
				}
			}
			for key, pod := range m.podSpecs() {
				for _, c := range pod.Spec.Containers {
					ref := c.Image
					if !strings.HasPrefix(ref, "ghcr.io/onceflow/onceflow:") && !strings.Contains(ref, "@sha256:") {
						t.Errorf("%s: %s container %s image %q is not a tagged ghcr.io/onceflow/onceflow", dir, key, c.Name, ref)
					}
					if strings.HasSuffix(dir, "prod") && strings.HasSuffix(ref, ":latest") {
						t.Errorf("%s: %s container %s runs %q; pin a release in prod", dir, key, c.Name, ref)
					}
				}
			}
		})
	}
}

// TestSecretsAreReferencesOnly: no Secret object and no secret value in the
// manifests; database URLs come from secretKeyRef, and the migrate Job uses
// a different (owner) Secret than the long-running binaries.
func TestSecretsAreReferencesOnly(t *testing.T) {
	t.Parallel()
	secretish := regexp.MustCompile(`(?i)password|secret|token|database_url|_key$`)
	for _, dir := range overlays {
		m := build(t, dir)
		if len(m.Secrets) > 0 {
			t.Errorf("%s renders Secret objects %v; secrets must be created outside the repo and only referenced", dir, keys(m.Secrets))
		}
		for n, cm := range m.ConfigMaps {
			for k, v := range cm.Data {
				if secretish.MatchString(k) || strings.Contains(v, "password=") || regexp.MustCompile(`://[^/\s]*:[^/\s]*@`).MatchString(v) {
					t.Errorf("%s: ConfigMap %s key %s looks like a secret; use a Secret and secretKeyRef", dir, n, k)
				}
			}
		}
		dbSecret := map[string]string{}
		for key, pod := range m.podSpecs() {
			for _, c := range pod.Spec.Containers {
				found := false
				for _, e := range c.Env {
					if secretish.MatchString(e.Name) && e.Value != "" {
						// A *_FILE setting names a file: fine when that file
						// is mounted from a Secret.
						if strings.HasSuffix(e.Name, "_FILE") {
							if _, ok := secretFile(&pod.Spec, &c, e.Value); !ok {
								t.Errorf("%s: %s container %s: %s=%s is not inside a Secret volume mount", dir, key, c.Name, e.Name, e.Value)
							}
							continue
						}
						t.Errorf("%s: %s container %s sets %s literally; use valueFrom.secretKeyRef", dir, key, c.Name, e.Name)
					}
					if e.Name == "ONCEFLOW_DATABASE_URL" {
						found = true
						if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
							t.Errorf("%s: %s container %s: ONCEFLOW_DATABASE_URL must come from a secretKeyRef", dir, key, c.Name)
						} else {
							dbSecret[key] = e.ValueFrom.SecretKeyRef.Name
						}
					}
				}
				if !found {
					t.Errorf("%s: %s container %s gets no ONCEFLOW_DATABASE_URL", dir, key, c.Name)
				}
			}
		}
		job := dbSecret["Job/onceflow-migrate"]
		for _, k := range []string{"Deployment/onceflow-relay", "Deployment/onceflow-consumer"} {
			if dbSecret[k] != "" && dbSecret[k] == job {
				t.Errorf("%s: %s uses the migrate Job's owner Secret %q; run it with a less privileged role", dir, k, job)
			}
		}
	}
}

// secretFile reports the Secret a file path of container c comes from: the
// path lies under a volume mount of a Secret volume (and, when the volume
// lists items, is one of them).
func secretFile(ps *corev1.PodSpec, c *corev1.Container, path string) (string, bool) {
	for _, vm := range c.VolumeMounts {
		rel, err := filepath.Rel(vm.MountPath, path)
		if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
			continue
		}
		for _, v := range ps.Volumes {
			if v.Name != vm.Name || v.Secret == nil {
				continue
			}
			if len(v.Secret.Items) == 0 {
				return v.Secret.SecretName, true
			}
			for _, it := range v.Secret.Items {
				if it.Path == rel {
					return v.Secret.SecretName, true
				}
			}
		}
	}
	return "", false
}

// TestAdminOnlyInsideCluster: where a binary runs its admin API, it needs
// its token file from a Secret, listens on a named container port other
// than the metrics port, and only in-cluster peers (pod selectors, no IP
// blocks, no "from anywhere") may reach that port; no Service exposes it
// outside the cluster and Prometheus does not scrape it.
func TestAdminOnlyInsideCluster(t *testing.T) {
	t.Parallel()
	for _, dir := range overlays {
		m := build(t, dir)
		adminPorts := map[int32]bool{}
		enabled := 0
		for key, pod := range m.podSpecs() {
			for i := range pod.Spec.Containers {
				c := &pod.Spec.Containers[i]
				env := containerEnv(m, c)
				if env["ONCEFLOW_ADMIN"] != "true" {
					continue
				}
				enabled++
				where := fmt.Sprintf("%s: %s container %s", dir, key, c.Name)
				file := env["ONCEFLOW_ADMIN_TOKEN_FILE"]
				if file == "" || file == "<ref>" {
					t.Errorf("%s enables the admin API without ONCEFLOW_ADMIN_TOKEN_FILE (a file path)", where)
				} else if _, ok := secretFile(&pod.Spec, c, file); !ok {
					t.Errorf("%s: the admin token file %s is not mounted from a Secret", where, file)
				}
				addr := env["ONCEFLOW_ADMIN_ADDR"]
				_, portText, err := net.SplitHostPort(addr)
				port, perr := strconv.Atoi(portText)
				if err != nil || perr != nil {
					t.Errorf("%s: ONCEFLOW_ADMIN_ADDR %q has no port", where, addr)
					continue
				}
				if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "admin" && int(p.ContainerPort) == port }) {
					t.Errorf("%s listens for the admin API on %d but declares no container port \"admin\" %d (ports %v)", where, port, port, c.Ports)
				}
				if port == 9090 {
					t.Errorf("%s: the admin API shares the metrics port 9090, which the monitoring namespace may reach", where)
				}
				adminPorts[int32(port)] = true
			}
		}
		if enabled == 0 {
			t.Errorf("%s: no container runs the admin API (the console)", dir)
		}
		np := m.NetworkPolicies["onceflow"]
		if np == nil {
			t.Fatalf("%s: no NetworkPolicy onceflow", dir)
		}
		admitted := map[int32]bool{}
		for _, in := range np.Spec.Ingress {
			hits := len(in.Ports) == 0 // no ports: every port
			for _, p := range in.Ports {
				if p.Port == nil || adminPorts[int32(p.Port.IntValue())] {
					hits = true
					if p.Port != nil {
						admitted[int32(p.Port.IntValue())] = true
					}
				}
			}
			if !hits {
				continue
			}
			if len(in.From) == 0 {
				t.Errorf("%s: a NetworkPolicy rule admits the admin port from anywhere (no from)", dir)
			}
			for _, peer := range in.From {
				if peer.IPBlock != nil {
					t.Errorf("%s: a NetworkPolicy rule admits the admin port from IP block %s (outside the cluster)", dir, peer.IPBlock.CIDR)
				}
				if peer.PodSelector == nil || len(peer.PodSelector.MatchLabels)+len(peer.PodSelector.MatchExpressions) == 0 {
					t.Errorf("%s: a NetworkPolicy rule admits the admin port from every pod of a namespace (%+v); select admin clients by label", dir, peer)
				}
			}
		}
		for p := range adminPorts {
			if !admitted[p] {
				t.Errorf("%s: the NetworkPolicy admits nobody to the admin port %d; in-cluster clients need a rule", dir, p)
			}
		}
		for n, svc := range m.Services {
			for _, sp := range svc.Spec.Ports {
				exposed := sp.TargetPort.String() == "admin" || adminPorts[sp.TargetPort.IntVal] || adminPorts[sp.Port]
				if !exposed {
					continue
				}
				if svc.Spec.Type != "" && svc.Spec.Type != corev1.ServiceTypeClusterIP {
					t.Errorf("%s: Service %s exposes the admin port as %s; keep it ClusterIP", dir, n, svc.Spec.Type)
				}
				if len(svc.Spec.ExternalIPs) > 0 {
					t.Errorf("%s: Service %s exposes the admin port on external IPs %v", dir, n, svc.Spec.ExternalIPs)
				}
				if svc.Labels["onceflow.io/metrics"] == "true" {
					t.Errorf("%s: Service %s with the admin port is scraped by the ServiceMonitor", dir, n)
				}
			}
		}
		if m.Services["onceflow-consumer-admin"] == nil {
			t.Errorf("%s: no Service onceflow-consumer-admin for the console", dir)
		}
	}
}

// TestPodSecurityRestricted checks the Pod Security "restricted" profile,
// plus a read-only root filesystem, resources and probes.
func TestPodSecurityRestricted(t *testing.T) {
	t.Parallel()
	for _, dir := range overlays {
		m := build(t, dir)
		for key, pod := range m.podSpecs() {
			ps := pod.Spec
			psc := ps.SecurityContext
			if ps.HostNetwork || ps.HostPID || ps.HostIPC {
				t.Errorf("%s: %s uses host namespaces", dir, key)
			}
			for _, v := range ps.Volumes {
				if v.HostPath != nil {
					t.Errorf("%s: %s mounts hostPath %s", dir, key, v.HostPath.Path)
				}
			}
			if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
				t.Errorf("%s: %s mounts a service account token it has no use for", dir, key)
			}
			for _, c := range append(slices.Clone(ps.InitContainers), ps.Containers...) {
				where := fmt.Sprintf("%s: %s container %s", dir, key, c.Name)
				sc := c.SecurityContext
				if sc == nil {
					t.Errorf("%s has no securityContext", where)
					continue
				}
				nonRoot := (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (sc.RunAsNonRoot == nil && psc != nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot)
				if !nonRoot {
					t.Errorf("%s: runAsNonRoot is not true", where)
				}
				if uid := runAsUser(psc, sc); uid != nil && *uid == 0 {
					t.Errorf("%s: runAsUser 0", where)
				}
				if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
					t.Errorf("%s: allowPrivilegeEscalation must be false", where)
				}
				if sc.Privileged != nil && *sc.Privileged {
					t.Errorf("%s: privileged", where)
				}
				if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
					t.Errorf("%s: capabilities must drop ALL", where)
				} else if len(sc.Capabilities.Add) > 0 {
					t.Errorf("%s: adds capabilities %v", where, sc.Capabilities.Add)
				}
				seccomp := sc.SeccompProfile
				if seccomp == nil && psc != nil {
					seccomp = psc.SeccompProfile
				}
				if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
					t.Errorf("%s: seccompProfile must be RuntimeDefault", where)
				}
				if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
					t.Errorf("%s: readOnlyRootFilesystem must be true", where)
				}
				for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
					req, okReq := c.Resources.Requests[r]
					lim, okLim := c.Resources.Limits[r]
					if !okReq || !okLim {
						t.Errorf("%s: resources must request and limit %s", where, r)
					} else if req.Cmp(lim) > 0 {
						t.Errorf("%s: %s request %s is above its limit %s", where, r, req.String(), lim.String())
					}
				}
				if strings.HasPrefix(key, "Deployment/") {
					if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
						t.Errorf("%s: livenessProbe must GET /healthz", where)
					}
					if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
						t.Errorf("%s: readinessProbe must GET /readyz", where)
					}
				}
			}
		}
	}
}

func runAsUser(psc *corev1.PodSecurityContext, sc *corev1.SecurityContext) *int64 {
	if sc != nil && sc.RunAsUser != nil {
		return sc.RunAsUser
	}
	if psc != nil {
		return psc.RunAsUser
	}
	return nil
}

// TestGracePeriodsOutlastTimeouts: SIGTERM must leave the relay time to end
// its Kafka transaction and the consumer time to commit its batch. The
// timeouts come from the manifests' settings or the engines' defaults.
func TestGracePeriodsOutlastTimeouts(t *testing.T) {
	t.Parallel()
	for _, dir := range overlays {
		m := build(t, dir)
		txn := relay.Config{}.WithDefaults().TransactionTimeout
		if v := envValue(m, m.Deployments["onceflow-relay"], "ONCEFLOW_TRANSACTION_TIMEOUT"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				t.Fatalf("%s: ONCEFLOW_TRANSACTION_TIMEOUT %q: %v", dir, v, err)
			}
			txn = d
		}
		// Transaction, then marking rows, a retry backoff and the HTTP
		// server's shutdown: ask for twice the transaction timeout.
		checkGrace(t, dir, m.Deployments["onceflow-relay"], 2*txn)
		batch := inbox.Config{}.WithDefaults().BatchTimeout
		commit := inbox.Config{}.WithDefaults().CommitTimeout
		checkGrace(t, dir, m.Deployments["onceflow-consumer"], batch+commit)
	}
}

func checkGrace(t *testing.T, dir string, d *appsv1.Deployment, atLeast time.Duration) {
	t.Helper()
	if d == nil {
		t.Errorf("%s: deployment missing", dir)
		return
	}
	g := d.Spec.Template.Spec.TerminationGracePeriodSeconds
	if g == nil || time.Duration(*g)*time.Second <= atLeast {
		t.Errorf("%s: %s terminationGracePeriodSeconds = %v, want more than %s", dir, d.Name, g, atLeast)
	}
}

// envValue is the literal value a container of d gets for name, from env or
// from envFrom ConfigMaps of m ("" if none).
func envValue(m *manifests, d *appsv1.Deployment, name string) string {
	if d == nil || len(d.Spec.Template.Spec.Containers) == 0 {
		return ""
	}
	return containerEnv(m, &d.Spec.Template.Spec.Containers[0])[name]
}

// containerEnv is the literal environment of c (env wins over envFrom;
// values from secrets and fields are "<ref>").
func containerEnv(m *manifests, c *corev1.Container) map[string]string {
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef != nil {
			if cm := m.ConfigMaps[ef.ConfigMapRef.Name]; cm != nil {
				for k, v := range cm.Data {
					env[ef.Prefix+k] = v
				}
			}
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			env[e.Name] = "<ref>"
		} else {
			env[e.Name] = e.Value
		}
	}
	return env
}

// TestScrapingAndDisruption: the ServiceMonitor finds both metrics Services,
// their ports lead to the pods' metrics port, the PDBs and the
// NetworkPolicy select the pods they are meant for.
func TestScrapingAndDisruption(t *testing.T) {
	t.Parallel()
	for _, dir := range overlays {
		m := build(t, dir)
		sm := m.ServiceMonitors["onceflow"]
		if sm == nil {
			t.Fatalf("%s: no ServiceMonitor onceflow", dir)
		}
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil {
			t.Fatalf("%s: ServiceMonitor selector: %v", dir, err)
		}
		jobs := map[string]bool{}
		for _, want := range []string{"onceflow-relay-metrics", "onceflow-consumer-metrics"} {
			svc := m.Services[want]
			if svc == nil {
				t.Errorf("%s: no Service %s", dir, want)
				continue
			}
			if !sel.Matches(labels.Set(svc.Labels)) {
				t.Errorf("%s: ServiceMonitor selector %s does not match Service %s labels %v", dir, sel, want, svc.Labels)
			}
			job := svc.Labels[sm.Spec.JobLabel]
			if job == "" {
				t.Errorf("%s: Service %s has no %s label (the ServiceMonitor's jobLabel)", dir, want, sm.Spec.JobLabel)
			}
			jobs[job] = true
			for _, ep := range sm.Spec.Endpoints {
				if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
					t.Errorf("%s: ServiceMonitor endpoint port %q is not a port of Service %s", dir, ep.Port, want)
				}
				if ep.Path != "" && ep.Path != "/metrics" {
					t.Errorf("%s: ServiceMonitor scrapes %s, the binaries serve /metrics", dir, ep.Path)
				}
			}
			pods := matchingDeployments(m, svc.Spec.Selector)
			if len(pods) != 1 {
				t.Errorf("%s: Service %s selects %v, want exactly one Deployment", dir, want, pods)
				continue
			}
			for _, sp := range svc.Spec.Ports {
				if !hasContainerPort(&m.Deployments[pods[0]].Spec.Template.Spec, sp.TargetPort.String()) {
					t.Errorf("%s: Service %s targetPort %s is not a container port of %s", dir, want, sp.TargetPort.String(), pods[0])
				}
			}
		}
		for _, r := range m.PrometheusRules {
			for _, g := range r.Spec.Groups {
				for _, rule := range g.Rules {
					for _, mm := range regexp.MustCompile(`job="([^"]+)"`).FindAllStringSubmatch(rule.Expr.String(), -1) {
						if !jobs[mm[1]] {
							t.Errorf("%s: alert %s selects job=%q but the ServiceMonitor yields jobs %v", dir, rule.Alert, mm[1], keys(jobs))
						}
					}
				}
			}
		}
		for _, d := range []string{"onceflow-relay", "onceflow-consumer"} {
			var covered []string
			for n, pdb := range m.PDBs {
				if slices.Contains(matchingDeployments(m, pdb.Spec.Selector.MatchLabels), d) {
					covered = append(covered, n)
				}
			}
			if len(covered) != 1 {
				t.Errorf("%s: Deployment %s is covered by PodDisruptionBudgets %v, want exactly one", dir, d, covered)
			}
		}
		if pdb := m.PDBs["onceflow-relay"]; pdb != nil {
			if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() < 1 {
				t.Errorf("%s: relay PDB must keep at least one relay (minAvailable >= 1)", dir)
			}
		}
		np := m.NetworkPolicies["onceflow"]
		if np == nil {
			t.Fatalf("%s: no NetworkPolicy onceflow", dir)
		}
		npSel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			t.Fatalf("%s: NetworkPolicy podSelector: %v", dir, err)
		}
		for key, pod := range m.podSpecs() {
			if !npSel.Matches(labels.Set(pod.Labels)) {
				t.Errorf("%s: NetworkPolicy onceflow does not select %s (pod labels %v)", dir, key, pod.Labels)
			}
		}
		if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
			t.Errorf("%s: NetworkPolicy must restrict both Ingress and Egress, has %v", dir, np.Spec.PolicyTypes)
		}
		metricsOpen := false
		for _, in := range np.Spec.Ingress {
			for _, p := range in.Ports {
				if p.Port != nil && p.Port.IntValue() == 9090 {
					metricsOpen = true
				}
			}
		}
		if !metricsOpen {
			t.Errorf("%s: NetworkPolicy lets no scrape reach port 9090", dir)
		}
	}
}

func matchingDeployments(m *manifests, sel map[string]string) []string {
	var out []string
	if len(sel) == 0 {
		return nil
	}
	for n, d := range m.Deployments {
		if labels.SelectorFromSet(sel).Matches(labels.Set(d.Spec.Template.Labels)) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

func hasContainerPort(ps *corev1.PodSpec, port string) bool {
	for _, c := range ps.Containers {
		for _, p := range c.Ports {
			if p.Name == port || fmt.Sprint(p.ContainerPort) == port {
				return true
			}
		}
	}
	return false
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestDockerfile checks the Dockerfile on its own: a static build of both
// binaries, copied into a distroless or scratch final stage that runs as a
// non-root user, at the paths the manifests run. image_test.go builds the
// image and compares it with the Dockerfile.
func TestDockerfile(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var stages [][]string // instructions per stage, continuation lines joined
	var cur strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		cur.WriteString(trimmed)
		ins := cur.String()
		cur.Reset()
		if strings.HasPrefix(strings.ToUpper(ins), "FROM ") {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			if !strings.HasPrefix(strings.ToUpper(ins), "ARG ") {
				t.Errorf("Dockerfile: %q before the first FROM", ins)
			}
			continue
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], ins)
	}
	if len(stages) < 2 {
		t.Fatalf("Dockerfile has %d stage(s), want a multi-stage build", len(stages))
	}
	all := strings.Join(slices.Concat(stages...), "\n")
	if !regexp.MustCompile(`CGO_ENABLED=0`).MatchString(all) {
		t.Error("Dockerfile: the build must set CGO_ENABLED=0 (static binaries)")
	}
	final := stages[len(stages)-1]
	from := strings.Fields(final[0])
	if len(from) < 2 || !(strings.HasPrefix(from[1], "gcr.io/distroless/static") || from[1] == "scratch") {
		t.Errorf("Dockerfile: final stage %q, want gcr.io/distroless/static… or scratch", final[0])
	}
	var user string
	copied := map[string]bool{}
	for _, ins := range final {
		f := strings.Fields(ins)
		switch strings.ToUpper(f[0]) {
		case "USER":
			user = f[1]
		case "COPY":
			copied[f[len(f)-1]] = true
		case "RUN":
			t.Errorf("Dockerfile: final stage runs %q; distroless has no shell", ins)
		}
	}
	if user == "" || user == "root" || strings.HasPrefix(user, "0:") || user == "0" {
		t.Errorf("Dockerfile: final stage USER is %q, want a non-root user", user)
	}
	want := map[string]bool{}
	for _, dir := range overlays {
		for _, pod := range build(t, dir).podSpecs() {
			for _, c := range pod.Spec.Containers {
				if len(c.Command) > 0 {
					want[c.Command[0]] = true
				}
			}
		}
	}
	for _, bin := range []string{"/usr/local/bin/relay", "/usr/local/bin/consumer"} {
		if !copied[bin] {
			t.Errorf("Dockerfile: final stage does not COPY %s", bin)
		}
		delete(want, bin)
	}
	for cmd := range want {
		t.Errorf("manifests run %s, which the Dockerfile does not install", cmd)
	}
	if !bytes.Contains(data, []byte("./cmd/relay")) || !bytes.Contains(data, []byte("./cmd/consumer")) {
		t.Error("Dockerfile: must build ./cmd/relay and ./cmd/consumer")
	}
}

// TestDockerignoreKeepsBuildInputs: .dockerignore must not drop a source
// or embedded file that `go build ./cmd/relay ./cmd/consumer` needs (a
// package gaining a go:embed of a docs/ or deploy/ file would otherwise
// break only the image build, which no test here can run).
func TestDockerignoreKeepsBuildInputs(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			patterns = append(patterns, strings.TrimPrefix(l, "/"))
		}
	}
	ignored := func(rel string) string {
		parts := strings.Split(rel, "/")
		for _, p := range patterns {
			for i := range parts {
				prefix := strings.Join(parts[:i+1], "/")
				if ok, _ := filepath.Match(p, prefix); ok {
					return p
				}
				if ok, _ := filepath.Match(p, parts[i]); ok && !strings.Contains(p, "/") && strings.HasPrefix(p, "*") {
					return p
				}
			}
		}
		return ""
	}
	cmd := exec.Command("go", "list", "-deps", "-f", `{{if not .Standard}}{{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{range .EmbedFiles}} {{.}}{{end}}{{end}}`, "./cmd/relay", "./cmd/consumer")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./cmd/...: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], root+string(filepath.Separator)) {
			continue // module cache
		}
		dir, _ := filepath.Rel(root, f[0])
		for _, file := range f[1:] {
			rel := filepath.ToSlash(filepath.Join(dir, file))
			if p := ignored(rel); p != "" {
				t.Errorf(".dockerignore pattern %q drops %s, which the binaries' build needs", p, rel)
			}
		}
	}
}

// TestRetentionConfigParses: the prune CronJob's retention file is one the
// binary accepts (classes parse, no TTL below a declared horizon).
func TestRetentionConfigParses(t *testing.T) {
	t.Parallel()
	for _, dir := range overlays {
		m := build(t, dir)
		cm := m.ConfigMaps["onceflow-retention"]
		if cm == nil {
			t.Fatalf("%s: no ConfigMap onceflow-retention for the prune CronJob", dir)
		}
		if _, err := retention.Parse([]byte(cm.Data["retention.json"])); err != nil {
			t.Errorf("%s: onceflow-retention retention.json: %v", dir, err)
		}
	}
}

// TestProdOverlayEncrypts: in the prod overlay nothing crosses the network
// in clear and the pods reach only what they need. The relay and the
// consumer speak SASL_SSL to Kafka (TLS with the brokers' CA, SCRAM with a
// user of their own and a password file, both from Secrets), serve the
// admin API and the console over TLS (key pair from a Secret), and the
// egress NetworkPolicy names where the database and the brokers are: no
// rule but DNS's goes to any address.
func TestProdOverlayEncrypts(t *testing.T) {
	t.Parallel()
	m := build(t, "overlays/prod")
	for _, key := range []string{"Deployment/onceflow-relay", "Deployment/onceflow-consumer"} {
		pod := m.podSpecs()[key]
		if pod == nil {
			t.Fatalf("no %s", key)
		}
		c := &pod.Spec.Containers[0]
		env := containerEnv(m, c)
		where := "overlays/prod: " + key
		if env["ONCEFLOW_KAFKA_TLS"] != "true" {
			t.Errorf("%s: Kafka without TLS (ONCEFLOW_KAFKA_TLS %q)", where, env["ONCEFLOW_KAFKA_TLS"])
		}
		if !strings.HasPrefix(env["ONCEFLOW_KAFKA_SASL_MECHANISM"], "SCRAM-SHA-") {
			t.Errorf("%s: Kafka SASL mechanism %q, want SCRAM-SHA-256 or -512", where, env["ONCEFLOW_KAFKA_SASL_MECHANISM"])
		}
		if env["ONCEFLOW_KAFKA_SASL_USER"] == "" {
			t.Errorf("%s: no Kafka SASL user", where)
		}
		for _, k := range []string{"ONCEFLOW_KAFKA_SASL_PASSWORD_FILE", "ONCEFLOW_KAFKA_TLS_CA_FILE", "ONCEFLOW_ADMIN_TLS_CERT_FILE", "ONCEFLOW_ADMIN_TLS_KEY_FILE"} {
			if env[k] == "" {
				t.Errorf("%s: %s is not set", where, k)
			} else if _, ok := secretFile(&pod.Spec, c, env[k]); !ok {
				t.Errorf("%s: %s %s is not mounted from a Secret", where, k, env[k])
			}
		}
		if env["ONCEFLOW_KAFKA_SASL_PASSWORD"] != "" {
			t.Errorf("%s: the SASL password is in the environment; mount it as a file", where)
		}
	}
	np := m.NetworkPolicies["onceflow"]
	if np == nil {
		t.Fatal("overlays/prod: no NetworkPolicy onceflow")
	}
	dns := func(p networkingv1.NetworkPolicyPort) bool {
		return p.Port != nil && p.Port.IntValue() == 53 && p.EndPort == nil
	}
	ports := map[int]bool{}
	for _, rule := range np.Spec.Egress {
		if len(rule.Ports) > 0 && !slices.ContainsFunc(rule.Ports, func(p networkingv1.NetworkPolicyPort) bool { return !dns(p) }) {
			continue // DNS
		}
		if len(rule.To) == 0 {
			t.Errorf("overlays/prod: an egress rule allows ports %v to any address; name the database's or the brokers' addresses", rule.Ports)
		}
		for _, peer := range rule.To {
			if peer.IPBlock != nil {
				if pfx, err := netip.ParsePrefix(peer.IPBlock.CIDR); err != nil || pfx.Bits() < 8 {
					t.Errorf("overlays/prod: an egress rule allows %s", peer.IPBlock.CIDR)
				}
			}
		}
		for _, p := range rule.Ports {
			if p.Port != nil {
				ports[p.Port.IntValue()] = true
			}
		}
	}
	if !ports[5432] || !ports[9093] || ports[9092] {
		t.Errorf("overlays/prod: egress ports %v, want 5432 and the brokers' SASL_SSL port 9093 (and not the plaintext 9092)", ports)
	}
}
