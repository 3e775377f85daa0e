package k8s_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/x509"
	"debug/elf"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/onceflow/onceflow/internal/testkit"
)

// The image tests build the image with scripts/image.sh (what `make image`
// runs) once per test process, read it back from the OCI archive, and check
// it against the Dockerfile and the manifests. Building takes about 3 s with
// a warm Go build cache and about 30 s cold (the static binaries), so `make
// test` builds it every time instead of caching it.

// ociDescriptor points at a blob of the archive.
type ociDescriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

// ociConfig is the part of the OCI image configuration the tests read.
type ociConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Created      string `json:"created"`
	Config       struct {
		User         string              `json:"User"`
		Env          []string            `json:"Env"`
		Entrypoint   []string            `json:"Entrypoint"`
		Cmd          []string            `json:"Cmd"`
		WorkingDir   string              `json:"WorkingDir"`
		ExposedPorts map[string]struct{} `json:"ExposedPorts"`
		Labels       map[string]string   `json:"Labels"`
		Volumes      map[string]struct{} `json:"Volumes"`
	} `json:"config"`
	History []struct {
		CreatedBy string `json:"created_by"`
	} `json:"history"`
}

// imageFile is one path of the image's flattened filesystem.
type imageFile struct {
	Header *tar.Header
	Data   []byte // regular files only
}

// ociImage is an image read back from its OCI archive.
type ociImage struct {
	Archive  string
	Digest   string // of the manifest
	Manifest struct {
		MediaType string          `json:"mediaType"`
		Config    ociDescriptor   `json:"config"`
		Layers    []ociDescriptor `json:"layers"`
	}
	Config ociConfig
	// Files by absolute path ("/usr/local/bin/relay"), all layers applied.
	Files map[string]*imageFile
}

var (
	imageOnce  sync.Once
	imageDir   string
	imageBuilt *ociImage
	imageErr   error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if imageDir != "" {
		os.RemoveAll(imageDir)
	}
	os.Exit(code)
}

// buildImage runs scripts/image.sh into a temporary archive, once per test
// process, and reads the archive back.
func buildImage(t *testing.T) *ociImage {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: builds the container image with buildah")
	}
	imageOnce.Do(func() {
		if imageDir, imageErr = os.MkdirTemp("", "onceflow-image-test-"); imageErr != nil {
			return
		}
		archive := filepath.Join(imageDir, "onceflow.oci.tar")
		if imageErr = runImageScript(archive); imageErr != nil {
			return
		}
		imageBuilt, imageErr = readOCIArchive(archive)
	})
	if imageErr != nil {
		t.Fatalf("build the image: %v", imageErr)
	}
	return imageBuilt
}

func runImageScript(archive string) error {
	start := time.Now()
	cmd := exec.Command("bash", "../../scripts/image.sh", archive)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("scripts/image.sh: %v\n%s", err, out)
	}
	fmt.Fprintf(os.Stderr, "image built in %s: %s", time.Since(start).Round(100*time.Millisecond), out)
	return nil
}

// readOCIArchive reads an OCI image layout tar: index.json, the manifest,
// the config and the layers (applied in order, whiteouts honoured).
func readOCIArchive(archive string) (*ociImage, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	entries := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", archive, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		entries[path.Clean(h.Name)] = b
	}
	blob := func(d ociDescriptor) ([]byte, error) {
		algo, hex, ok := strings.Cut(d.Digest, ":")
		b, found := entries[path.Join("blobs", algo, hex)]
		if !ok || !found {
			return nil, fmt.Errorf("blob %s is not in the archive", d.Digest)
		}
		if int64(len(b)) != d.Size {
			return nil, fmt.Errorf("blob %s has %d bytes, its descriptor says %d", d.Digest, len(b), d.Size)
		}
		return b, nil
	}
	if layout := string(entries["oci-layout"]); !strings.Contains(layout, `"imageLayoutVersion"`) {
		return nil, fmt.Errorf("no oci-layout file: not an OCI image layout")
	}
	var index struct {
		Manifests []ociDescriptor `json:"manifests"`
	}
	if err := json.Unmarshal(entries["index.json"], &index); err != nil {
		return nil, fmt.Errorf("index.json: %w", err)
	}
	if len(index.Manifests) != 1 {
		return nil, fmt.Errorf("index.json lists %d manifests, want 1", len(index.Manifests))
	}
	img := &ociImage{Archive: archive, Digest: index.Manifests[0].Digest, Files: map[string]*imageFile{}}
	b, err := blob(index.Manifests[0])
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &img.Manifest); err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	if b, err = blob(img.Manifest.Config); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &img.Config); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	for _, l := range img.Manifest.Layers {
		b, err := blob(l)
		if err != nil {
			return nil, err
		}
		var r io.Reader = bytes.NewReader(b)
		switch l.MediaType {
		case "application/vnd.oci.image.layer.v1.tar+gzip":
			if r, err = gzip.NewReader(r); err != nil {
				return nil, fmt.Errorf("layer %s: %w", l.Digest, err)
			}
		case "application/vnd.oci.image.layer.v1.tar":
		default:
			return nil, fmt.Errorf("layer %s has media type %s", l.Digest, l.MediaType)
		}
		lr := tar.NewReader(r)
		for {
			h, err := lr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("layer %s: %w", l.Digest, err)
			}
			name := path.Join("/", h.Name)
			dir, base := path.Split(name)
			if base == ".wh..wh..opq" {
				for p := range img.Files {
					if strings.HasPrefix(p, dir) {
						delete(img.Files, p)
					}
				}
				continue
			}
			if strings.HasPrefix(base, ".wh.") {
				gone := path.Join(dir, strings.TrimPrefix(base, ".wh."))
				for p := range img.Files {
					if p == gone || strings.HasPrefix(p, gone+"/") {
						delete(img.Files, p)
					}
				}
				continue
			}
			f := &imageFile{Header: h}
			if h.Typeflag == tar.TypeReg {
				if f.Data, err = io.ReadAll(lr); err != nil {
					return nil, err
				}
			}
			img.Files[name] = f
		}
	}
	return img, nil
}

// userIDs splits the image's numeric USER "uid:gid".
func (img *ociImage) userIDs(t *testing.T) (uid, gid int64) {
	t.Helper()
	u, g, ok := strings.Cut(img.Config.Config.User, ":")
	var err1, err2 error
	uid, err1 = strconv.ParseInt(u, 10, 64)
	gid, err2 = strconv.ParseInt(g, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		t.Fatalf("image USER %q is not numeric uid:gid (Kubernetes can only verify runAsNonRoot for a numeric user)", img.Config.Config.User)
	}
	return uid, gid
}

// TestImageArchive reads the image `make image` builds: static relay and
// consumer at /usr/local/bin, a non-root numeric user known to /etc/passwd
// and /etc/group, no shell or other executable, nothing writable but /tmp,
// a CA bundle that parses, and the OCI labels.
func TestImageArchive(t *testing.T) {
	img := buildImage(t)
	t.Parallel()
	cfg := img.Config
	t.Logf("image %s: %d layer(s), %d paths, manifest %s", img.Archive, len(img.Manifest.Layers), len(img.Files), img.Digest)

	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH {
		t.Errorf("image platform %s/%s, want linux/%s", cfg.OS, cfg.Architecture, runtime.GOARCH)
	}
	uid, gid := img.userIDs(t)
	if uid == 0 || gid == 0 {
		t.Errorf("image runs as %s; want a non-root user and group", cfg.Config.User)
	}
	if name := lookupID(t, img, "/etc/passwd", 2, uid); name != "nonroot" {
		t.Errorf("/etc/passwd names uid %d %q, want nonroot", uid, name)
	}
	if name := lookupID(t, img, "/etc/group", 2, gid); name != "nonroot" {
		t.Errorf("/etc/group names gid %d %q, want nonroot", gid, name)
	}
	if len(cfg.Config.Entrypoint) != 0 {
		t.Errorf("image ENTRYPOINT %q; want none (the manifests choose the binary with command:)", cfg.Config.Entrypoint)
	}
	if want := []string{"/usr/local/bin/relay", "-help"}; !slices.Equal(cfg.Config.Cmd, want) {
		t.Errorf("image CMD %q, want %q", cfg.Config.Cmd, want)
	}
	if !slices.Contains(cfg.Config.Env, "PATH=/usr/local/bin") {
		t.Errorf("image Env %q lacks PATH=/usr/local/bin (so `docker run IMAGE consumer …` finds the binary)", cfg.Config.Env)
	}
	if len(cfg.Config.Volumes) != 0 {
		t.Errorf("image declares volumes %v; it writes nothing", cfg.Config.Volumes)
	}
	for _, h := range cfg.History {
		if strings.Contains(h.CreatedBy, "/bin/sh") {
			t.Errorf("image history says %q; nothing in this image ran a shell", h.CreatedBy)
		}
	}

	// Labels: the OCI annotation keys, the revision the commit built.
	for _, k := range []string{"title", "description", "source", "version", "revision", "created"} {
		if cfg.Config.Labels["org.opencontainers.image."+k] == "" {
			t.Errorf("image lacks the label org.opencontainers.image.%s", k)
		}
	}
	if c := cfg.Config.Labels["org.opencontainers.image.created"]; c != "" {
		if _, err := time.Parse(time.RFC3339, c); err != nil {
			t.Errorf("label org.opencontainers.image.created %q is not RFC 3339", c)
		}
	}
	if head, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil {
		if got, want := cfg.Config.Labels["org.opencontainers.image.revision"], strings.TrimSpace(string(head)); got != want {
			t.Errorf("label org.opencontainers.image.revision %q, want the checked-out commit %s", got, want)
		}
	}

	// The binaries: static, executable, not writable by the user.
	for _, bin := range []string{"/usr/local/bin/relay", "/usr/local/bin/consumer"} {
		f := img.Files[bin]
		if f == nil || f.Header.Typeflag != tar.TypeReg {
			t.Errorf("image has no file %s", bin)
			continue
		}
		if f.Header.Mode&0o777 != 0o755 || f.Header.Uid != 0 {
			t.Errorf("%s: mode %o owner %d, want 755 owned by root", bin, f.Header.Mode&0o777, f.Header.Uid)
		}
		if err := checkStatic(f.Data); err != nil {
			t.Errorf("%s: %v", bin, err)
		}
	}

	// No shell, nothing else to execute, nothing writable but /tmp.
	var executables []string
	for p, f := range img.Files {
		h := f.Header
		switch path.Base(p) {
		case "sh", "bash", "dash", "ash", "zsh", "busybox":
			t.Errorf("image has %s: there must be no shell", p)
		}
		if h.Typeflag == tar.TypeReg && h.Mode&0o111 != 0 {
			executables = append(executables, p)
		}
		if h.Typeflag == tar.TypeSymlink || h.Typeflag == tar.TypeLink {
			t.Errorf("image has a link %s -> %s; it needs none", p, h.Linkname)
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s is owned by %d:%d; everything in the image is root's", p, h.Uid, h.Gid)
		}
		if h.Mode&0o022 != 0 && !(p == "/tmp" && h.Mode&0o7777 == 0o1777) {
			t.Errorf("%s is writable by group or others (mode %o)", p, h.Mode&0o7777)
		}
	}
	slices.Sort(executables)
	if want := []string{"/usr/local/bin/consumer", "/usr/local/bin/relay"}; !slices.Equal(executables, want) {
		t.Errorf("executables in the image: %v, want only %v", executables, want)
	}
	if f := img.Files["/tmp"]; f == nil || f.Header.Typeflag != tar.TypeDir || f.Header.Mode&0o7777 != 0o1777 {
		t.Error("image has no /tmp with mode 1777")
	}

	// The CA bundle Go's crypto/x509 reads on Linux.
	ca := img.Files["/etc/ssl/certs/ca-certificates.crt"]
	if ca == nil {
		t.Fatal("image has no /etc/ssl/certs/ca-certificates.crt")
	}
	n, rest := 0, ca.Data
	for {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			t.Errorf("CA bundle: certificate %d: %v", n+1, err)
		}
		n++
	}
	if n < 100 {
		t.Errorf("CA bundle holds %d certificates; Debian's has well over 100", n)
	}
	t.Logf("user %s, cmd %q, %d CA certificates, labels %v", cfg.Config.User, cfg.Config.Cmd, n, cfg.Config.Labels)
}

// lookupID returns the name of the line of an /etc/passwd-style file whose
// field (0-based) is id.
func lookupID(t *testing.T, img *ociImage, file string, field int, id int64) string {
	t.Helper()
	f := img.Files[file]
	if f == nil {
		t.Errorf("image has no %s", file)
		return ""
	}
	for _, line := range strings.Split(string(f.Data), "\n") {
		parts := strings.Split(line, ":")
		if len(parts) > field && parts[field] == strconv.FormatInt(id, 10) {
			return parts[0]
		}
	}
	return ""
}

// checkStatic: an ELF executable with no interpreter and no shared
// libraries (CGO_ENABLED=0), so it runs on an image with no libc.
func checkStatic(data []byte) error {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("not an ELF file: %w", err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("ELF type %s, want an executable", f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked: it has a program interpreter (build with CGO_ENABLED=0)")
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		return fmt.Errorf("needs shared libraries %v (build with CGO_ENABLED=0)", libs)
	}
	return nil
}

// TestImageReproducible: the same commit builds the same image (manifest
// digest), so a digest pinned in prod names exactly one build.
func TestImageReproducible(t *testing.T) {
	img := buildImage(t)
	t.Parallel()
	archive := filepath.Join(t.TempDir(), "again.oci.tar")
	if err := runImageScript(archive); err != nil {
		t.Fatal(err)
	}
	if again := manifestDigest(t, archive); again != img.Digest {
		t.Errorf("two builds of the same tree: manifests %s and %s", img.Digest, again)
	}
}

// manifestDigest reads only index.json of an OCI archive.
func manifestDigest(t *testing.T, archive string) string {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s: no index.json (%v)", archive, err)
		}
		if path.Clean(h.Name) != "index.json" {
			continue
		}
		var index struct {
			Manifests []ociDescriptor `json:"manifests"`
		}
		if err := json.NewDecoder(tr).Decode(&index); err != nil || len(index.Manifests) != 1 {
			t.Fatalf("%s: index.json: %v, %d manifests", archive, err, len(index.Manifests))
		}
		return index.Manifests[0].Digest
	}
}

// dockerInstruction is one instruction of the Dockerfile, continuation
// lines joined.
type dockerInstruction struct {
	Cmd  string // upper case
	Args string
}

// dockerfileStages splits the Dockerfile into its stages' instructions.
func dockerfileStages(t *testing.T) [][]dockerInstruction {
	t.Helper()
	data, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var stages [][]dockerInstruction
	var cur strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		cur.Reset()
		ins := dockerInstruction{Cmd: strings.ToUpper(cmd), Args: strings.TrimSpace(args)}
		if ins.Cmd == "FROM" {
			stages = append(stages, nil)
		}
		if len(stages) > 0 {
			stages[len(stages)-1] = append(stages[len(stages)-1], ins)
		}
	}
	return stages
}

// keyValues parses LABEL/ENV arguments: key=value or key="value with spaces".
func keyValues(s string) (map[string]string, error) {
	out := map[string]string{}
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		k, rest, ok := strings.Cut(s, "=")
		if !ok || strings.ContainsAny(k, " \t") {
			return nil, fmt.Errorf("%q is not key=value", s)
		}
		var v string
		if strings.HasPrefix(rest, `"`) {
			end := 1
			for end < len(rest) && (rest[end] != '"' || rest[end-1] == '\\') {
				end++
			}
			if end == len(rest) {
				return nil, fmt.Errorf("unterminated quote in %q", s)
			}
			v, s = strings.ReplaceAll(rest[1:end], `\"`, `"`), rest[end+1:]
		} else {
			v, s, _ = strings.Cut(rest, " ")
		}
		out[k] = v
	}
	return out, nil
}

var argRef = regexp.MustCompile(`^\$\{?([A-Z_][A-Z0-9_]*)\}?$`)

// TestImageMatchesDockerfile: the Dockerfile, for users with Docker, and
// scripts/image.sh describe the same image: the same user, command, no
// entrypoint, environment, working directory, port, labels, files, and the
// same rootfs script and build flags.
func TestImageMatchesDockerfile(t *testing.T) {
	img := buildImage(t)
	t.Parallel()
	cfg := img.Config.Config
	stages := dockerfileStages(t)
	if len(stages) < 2 {
		t.Fatalf("Dockerfile has %d stage(s)", len(stages))
	}
	final := stages[len(stages)-1]
	if from := strings.Fields(final[0].Args); len(from) == 0 || from[0] != "scratch" {
		t.Errorf("Dockerfile final stage FROM %q; the image is built from scratch", final[0].Args)
	}
	args := map[string]bool{}
	var user, workdir string
	var cmd, entrypoint []string
	env, labels := map[string]string{}, map[string]string{}
	var exposed, copied []string
	for _, ins := range final[1:] {
		switch ins.Cmd {
		case "ARG":
			name, _, _ := strings.Cut(ins.Args, "=")
			args[name] = true
		case "USER":
			user = ins.Args
		case "WORKDIR":
			workdir = ins.Args
		case "CMD", "ENTRYPOINT":
			var v []string
			if err := json.Unmarshal([]byte(ins.Args), &v); err != nil {
				t.Errorf("Dockerfile %s %s is not the exec (JSON) form; the image has no shell for the other form", ins.Cmd, ins.Args)
			}
			if ins.Cmd == "CMD" {
				cmd = v
			} else {
				entrypoint = v
			}
		case "ENV", "LABEL":
			kv, err := keyValues(ins.Args)
			if err != nil {
				t.Errorf("Dockerfile %s: %v", ins.Cmd, err)
			}
			for k, v := range kv {
				if ins.Cmd == "ENV" {
					env[k] = v
				} else {
					labels[k] = v
				}
			}
		case "EXPOSE":
			for _, p := range strings.Fields(ins.Args) {
				if !strings.Contains(p, "/") {
					p += "/tcp"
				}
				exposed = append(exposed, p)
			}
		case "COPY":
			f := strings.Fields(ins.Args)
			copied = append(copied, f[len(f)-1])
		case "RUN":
			t.Errorf("Dockerfile final stage runs %q; the image has no shell", ins.Args)
		}
	}
	if user != cfg.User {
		t.Errorf("Dockerfile USER %q, image %q", user, cfg.User)
	}
	if workdir != cfg.WorkingDir {
		t.Errorf("Dockerfile WORKDIR %q, image %q", workdir, cfg.WorkingDir)
	}
	if !slices.Equal(cmd, cfg.Cmd) {
		t.Errorf("Dockerfile CMD %q, image %q", cmd, cfg.Cmd)
	}
	if !slices.Equal(entrypoint, cfg.Entrypoint) {
		t.Errorf("Dockerfile ENTRYPOINT %q, image %q", entrypoint, cfg.Entrypoint)
	}
	imageEnv := map[string]string{}
	for _, kv := range cfg.Env {
		k, v, _ := strings.Cut(kv, "=")
		imageEnv[k] = v
	}
	if fmt.Sprint(env) != fmt.Sprint(imageEnv) {
		t.Errorf("Dockerfile ENV %v, image %v", env, imageEnv)
	}
	var imagePorts []string
	for p := range cfg.ExposedPorts {
		imagePorts = append(imagePorts, p)
	}
	slices.Sort(exposed)
	slices.Sort(imagePorts)
	if !slices.Equal(exposed, imagePorts) {
		t.Errorf("Dockerfile EXPOSE %v, image %v", exposed, imagePorts)
	}
	for _, k := range keys(labels) {
		got, ok := cfg.Labels[k]
		switch m := argRef.FindStringSubmatch(labels[k]); {
		case !ok:
			t.Errorf("Dockerfile LABEL %s is not on the image", k)
		case m != nil:
			if !args[m[1]] {
				t.Errorf("Dockerfile LABEL %s uses ${%s}, which the final stage does not declare with ARG", k, m[1])
			}
			if got == "" {
				t.Errorf("image label %s is empty (the Dockerfile sets it from ${%s})", k, m[1])
			}
		case got != labels[k]:
			t.Errorf("label %s: Dockerfile %q, image %q", k, labels[k], got)
		}
	}
	for _, k := range keys(cfg.Labels) {
		if _, ok := labels[k]; !ok {
			t.Errorf("image label %s=%q is not in the Dockerfile", k, cfg.Labels[k])
		}
	}
	for _, dst := range copied {
		if dst != "/" && img.Files[path.Clean(dst)] == nil {
			t.Errorf("Dockerfile copies to %s, which the image lacks", dst)
		}
	}

	// Both build the files the same way.
	script, err := os.ReadFile("../../scripts/image.sh")
	if err != nil {
		t.Fatal(err)
	}
	dockerfile, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"scripts/image-rootfs.sh ", "CGO_ENABLED=0", "-trimpath", `-ldflags="-s -w"`, "./cmd/relay", "./cmd/consumer"} {
		for name, text := range map[string][]byte{"Dockerfile": dockerfile, "scripts/image.sh": script} {
			if !bytes.Contains(text, []byte(want)) {
				t.Errorf("%s lacks %q; the Dockerfile and scripts/image.sh must build alike", name, want)
			}
		}
	}
	if !slices.Contains(copied, "/") || !strings.Contains(string(dockerfile), "COPY --from=build /rootfs/ /") {
		t.Error("Dockerfile does not copy the rootfs of scripts/image-rootfs.sh (/rootfs/) to /")
	}
	ignore, err := os.ReadFile("../../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(ignore), "\n") {
		l = strings.TrimPrefix(strings.TrimSpace(l), "/")
		for _, p := range []string{"scripts", "scripts/image-rootfs.sh"} {
			if ok, _ := filepath.Match(l, p); ok && l != "" && !strings.HasPrefix(l, "#") {
				t.Errorf(".dockerignore pattern %q drops %s, which the Dockerfile runs", l, p)
			}
		}
	}
}

// TestImageMatchesManifests: every pod of every overlay runs a binary the
// image has, as the image's user, on a root filesystem it only reads, with
// no volume hiding the image's files, on a port the image exposes.
func TestImageMatchesManifests(t *testing.T) {
	img := buildImage(t)
	t.Parallel()
	uid, gid := img.userIDs(t)
	for _, dir := range overlays {
		for key, pod := range build(t, dir).podSpecs() {
			psc := pod.Spec.SecurityContext
			for _, c := range pod.Spec.Containers {
				where := fmt.Sprintf("%s: %s container %s", dir, key, c.Name)
				if len(c.Command) == 0 {
					t.Errorf("%s has no command; the image has no entrypoint", where)
					continue
				}
				if f := img.Files[c.Command[0]]; f == nil || f.Header.Mode&0o111 == 0 {
					t.Errorf("%s runs %s, which is no executable in the image", where, c.Command[0])
				}
				if u := runAsUser(psc, c.SecurityContext); u != nil && *u != uid {
					t.Errorf("%s: runAsUser %d, the image's user is %d (%s)", where, *u, uid, img.Config.Config.User)
				}
				if g := runAsGroup(psc, c.SecurityContext); g != nil && *g != gid {
					t.Errorf("%s: runAsGroup %d, the image's group is %d", where, *g, gid)
				}
				if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
					t.Errorf("%s: the root filesystem is not read-only", where)
				}
				for _, vm := range c.VolumeMounts {
					for p := range img.Files {
						if p == vm.MountPath || strings.HasPrefix(p, strings.TrimSuffix(vm.MountPath, "/")+"/") {
							if p != "/tmp" {
								t.Errorf("%s mounts %s over the image's %s", where, vm.MountPath, p)
							}
							break
						}
					}
				}
				for _, p := range c.Ports {
					if _, ok := img.Config.Config.ExposedPorts[fmt.Sprintf("%d/%s", p.ContainerPort, strings.ToLower(string(protocol(p))))]; !ok {
						t.Errorf("%s declares port %d, which the image does not expose (%v)", where, p.ContainerPort, img.Config.Config.ExposedPorts)
					}
				}
			}
		}
	}
}

func protocol(p corev1.ContainerPort) corev1.Protocol {
	if p.Protocol == "" {
		return corev1.ProtocolTCP
	}
	return p.Protocol
}

func runAsGroup(psc *corev1.PodSecurityContext, sc *corev1.SecurityContext) *int64 {
	if sc != nil && sc.RunAsGroup != nil {
		return sc.RunAsGroup
	}
	if psc != nil {
		return psc.RunAsGroup
	}
	return nil
}

// podman runs containers from a private storage under dir: the vfs driver
// (no overlay or FUSE needed), runc and cgroupfs (crun refuses this kind of
// machine's hybrid cgroups), events to a file (no journald).
type podman struct {
	dir  string
	base []string
}

func newPodman(t *testing.T) *podman {
	t.Helper()
	dir, err := os.MkdirTemp("", "onceflow-podman-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := &podman{dir: dir, base: []string{"--root", filepath.Join(dir, "storage"), "--runroot", filepath.Join(dir, "run"),
		"--tmpdir", filepath.Join(dir, "tmp"), "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "file"}}
	if _, err := exec.LookPath("runc"); err == nil {
		p.base = append(p.base, "--runtime", "runc")
	}
	t.Cleanup(func() {
		_, _ = p.cmd(context.Background(), "rm", "--all", "--force")
		os.RemoveAll(dir)
	})
	return p
}

func (p *podman) cmd(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "podman", append(slices.Clone(p.base), args...)...).CombinedOutput()
	return string(out), err
}

// runFlags are the flags of every `podman run`: the host network (the test
// services listen on loopback), a read-only root filesystem and no
// capabilities, as in the manifests. The limits are set explicitly because
// podman's defaults are above what this kind of machine lets runc set.
var runFlags = []string{"run", "--rm", "--network", "host", "--read-only", "--cap-drop", "ALL",
	"--security-opt", "no-new-privileges", "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"}

// canRunContainers runs a container made of nothing but one static binary
// taken from the image (podman --rootfs): if that fails, the machine cannot
// run containers, whatever the image holds.
func canRunContainers(t *testing.T, img *ociImage, p *podman) error {
	t.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		return errors.New("podman is not installed (scripts/require.sh test installs it as root)")
	}
	rootfs := filepath.Join(p.dir, "probe")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "probe"), img.Files["/usr/local/bin/consumer"].Data, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := p.cmd(ctx, append(slices.Clone(runFlags), "--rootfs", rootfs, "/probe", "-help")...)
	if err != nil && !strings.Contains(out, "usage: consumer") {
		return fmt.Errorf("podman run --rootfs of a static binary: %v: %s", err, strings.TrimSpace(out))
	}
	return nil
}

// TestImageRuns runs the image the way the manifests do: the migrate Job's
// command and environment against an empty test database (the schema must
// be there afterwards), and `consumer -help`, each as the image's user with a
// read-only root filesystem. Where this machine cannot run containers it says
// so and why; the other image tests still check the archive.
func TestImageRuns(t *testing.T) {
	needServices(t)
	img := buildImage(t)
	t.Parallel()
	if _, ok := img.Files["/usr/local/bin/consumer"]; !ok {
		t.Fatal("image has no /usr/local/bin/consumer")
	}
	p := newPodman(t)
	if err := canRunContainers(t, img, p); err != nil {
		t.Logf("\n*** CONTAINERS NOT RUN: this machine cannot run a container, so the image was not started.\n*** Reason: %v\n"+
			"*** Checked without running it: TestImageArchive, TestImageMatchesDockerfile, TestImageMatchesManifests.", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := p.cmd(ctx, "load", "--quiet", "--input", img.Archive)
	if err != nil {
		t.Fatalf("podman load %s: %v\n%s", img.Archive, err, out)
	}
	ref := strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), " ")+1:])
	if !strings.HasPrefix(ref, "sha256:") {
		t.Fatalf("podman load printed %q; want the image id", out)
	}

	t.Run("consumer -help", func(t *testing.T) {
		// -help exits 0 or 2 (flag.ErrHelp); the usage text is what counts.
		out, err := p.cmd(ctx, append(slices.Clone(runFlags), ref, "/usr/local/bin/consumer", "-help")...)
		if !strings.Contains(out, "usage: consumer") {
			t.Fatalf("consumer -help in the image: %v\n%s", err, out)
		}
	})

	t.Run("relay migrate as the migrate Job", func(t *testing.T) {
		ct := findContainer(t, "overlays/prod", "Job/onceflow-migrate")
		db := testkit.EmptyDB(t)
		args := slices.Clone(runFlags)
		for _, kv := range resolveEnv(t, ct, map[string]string{"ONCEFLOW_DATABASE_URL": db.URL}) {
			args = append(args, "--env", kv)
		}
		args = append(args, ref)
		args = append(args, ct.C.Command...)
		args = append(args, ct.C.Args...)
		start := time.Now()
		out, err := p.cmd(ctx, args...)
		if err != nil {
			t.Fatalf("%s %v in the image: %v\n%s", ct.C.Command[0], ct.C.Args, err, out)
		}
		var version int64
		if err := db.Pool.QueryRow(ctx, "SELECT max(version) FROM onceflow.schema_version").Scan(&version); err != nil || version < 1 {
			t.Fatalf("after `%s %s` in the image the schema is not there (version %d, %v); output:\n%s",
				ct.C.Command[0], strings.Join(ct.C.Args, " "), version, err, out)
		}
		t.Logf("`%s %s` in the image (uid %s, read-only root) migrated an empty database to version %d in %s",
			ct.C.Command[0], strings.Join(ct.C.Args, " "), img.Config.Config.User, version, time.Since(start).Round(10*time.Millisecond))
	})
}
