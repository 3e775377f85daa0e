package soak

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// The disk-full fault: one broker's data directory is a tmpfs of its own;
// the fault shrinks the tmpfs to what it holds (plus a little), so that the
// broker's next writes fail with "no space left on device", and heals by
// giving it back its size. tmpfs may shrink to its usage but not below, and
// shrinking allocates nothing: the fault costs no memory and no writes.

// mountTmpfs mounts a tmpfs of size bytes on dir.
func mountTmpfs(ctx context.Context, dir string, size int64) error {
	if os.Geteuid() != 0 {
		return errors.New("not root: a tmpfs cannot be mounted")
	}
	out, err := exec.CommandContext(ctx, "mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0755", size), "onceflow-soak", dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mount tmpfs on %s: %v: %s", dir, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func unmount(dir string) error {
	if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("umount %s: %v: %s", dir, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// resizeTmpfs sets the tmpfs on dir to size bytes.
func resizeTmpfs(ctx context.Context, dir string, size int64) error {
	out, err := exec.CommandContext(ctx, "mount", "-o", fmt.Sprintf("remount,size=%d", size), dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("resize tmpfs %s to %d bytes: %v: %s", dir, size, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// fillTmpfs shrinks the tmpfs on dir to its usage plus slack bytes and
// returns the usage it saw. The broker writes meanwhile, so a shrink that
// comes too late (below the usage by then) is tried again.
func fillTmpfs(ctx context.Context, dir string, slack int64) (int64, error) {
	var err error
	for range 20 {
		var st syscall.Statfs_t
		if err = syscall.Statfs(dir, &st); err != nil {
			return 0, err
		}
		used := int64(st.Blocks-st.Bfree) * st.Bsize
		if err = resizeTmpfs(ctx, dir, used+slack); err == nil {
			return used, nil
		}
	}
	return 0, err
}
