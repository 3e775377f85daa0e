package inbox

import (
	"path"
	"regexp"
	"testing"
)

// TestGlobRegexp: a retention class's glob and the regular expression the
// database matches new event types with (onceflow.inbox_lane) agree.
func TestGlobRegexp(t *testing.T) {
	globs := []string{"*", "payment.*", "ping.?", "a[bc].*", "a[^b]c", "x[a-c]y", `lit\*`, "order.placed", "a.b+c(d)", "*.v2"}
	types := []string{"", "payment.made", "payment.", "paymentxmade", "ping.a", "ping.ab", "ab.x", "ac.y", "ad.z", "aac", "abc", "xby", "xdy",
		"lit*", "litx", "order.placed", "orderxplaced", "a.b+c(d)", "a.bbc(d)", "e.v2", "a/b.v2", "p/q"}
	for _, g := range globs {
		re := regexp.MustCompile(GlobRegexp(g))
		for _, typ := range types {
			want, _ := path.Match(g, typ)
			if got := re.MatchString(typ); got != want {
				t.Errorf("glob %q, type %q: regexp %s says %v, path.Match %v", g, typ, GlobRegexp(g), got, want)
			}
		}
	}
}
