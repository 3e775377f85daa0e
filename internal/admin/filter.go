package admin

import (
	"flag"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inbox/status"
)

// FilterParams are a dead-letter filter as an operator types it: the
// consumer's dlq flags and the admin API's query parameters and JSON both
// become one, and Filter turns it into an inbox.DeadLetterFilter, so that
// both speak the same language.
type FilterParams struct {
	// Status: dead, held, or both comma-separated (default both).
	Status string `json:"status,omitempty"`
	// EventType: exact, or a glob with '*' (billing.*).
	EventType string `json:"event_type,omitempty"`
	Source    string `json:"source,omitempty"`
	// Error: a substring of the last error, any case.
	Error string `json:"error,omitempty"`
	// From and To bound the receive time (RFC 3339; To exclusive).
	From string `json:"from,omitempty"`
	To   string `json:"to,omitempty"`
	// Since: received within this duration before now (instead of From).
	Since string `json:"since,omitempty"`
	// Group: an error group's id (dlq list -group-by error, or the
	// console).
	Group string `json:"group,omitempty"`
}

// FilterFlags are the names of the flags RegisterFlags registers.
var FilterFlags = []string{"status", "event-type", "source", "error", "from", "to", "since", "error-group"}

// RegisterFlags registers the filter flags of `consumer dlq list/replay`.
func (p *FilterParams) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&p.Status, "status", "", "only rows of this status: dead or held (default both)")
	fs.StringVar(&p.EventType, "event-type", "", "only this event type; '*' matches any run of characters (billing.*)")
	fs.StringVar(&p.Source, "source", "", "only this source")
	fs.StringVar(&p.Error, "error", "", "only rows whose last error contains this text (any case)")
	fs.StringVar(&p.From, "from", "", "only rows received at or after this time (RFC 3339)")
	fs.StringVar(&p.To, "to", "", "only rows received before this time (RFC 3339)")
	fs.StringVar(&p.Since, "since", "", "only rows received within this duration (e.g. 2h), instead of -from")
	fs.StringVar(&p.Group, "error-group", "", "only this error group (its id from `dlq list -group-by error`)")
}

// FilterFromQuery reads the filter from URL query parameters of the same
// names as the JSON fields.
func FilterFromQuery(q url.Values) FilterParams {
	return FilterParams{
		Status: q.Get("status"), EventType: q.Get("event_type"), Source: q.Get("source"), Error: q.Get("error"),
		From: q.Get("from"), To: q.Get("to"), Since: q.Get("since"), Group: q.Get("group"),
	}
}

// Empty reports whether no filter is set.
func (p FilterParams) Empty() bool { return p == FilterParams{} }

// Filter checks p and returns the filter it means at now. Errors name the
// parameter.
func (p FilterParams) Filter(now time.Time) (inbox.DeadLetterFilter, error) {
	f := inbox.DeadLetterFilter{
		EventType: strings.TrimSpace(p.EventType), Source: p.Source, ErrorContains: p.Error, Group: strings.TrimSpace(p.Group),
	}
	for s := range strings.SplitSeq(p.Status, ",") {
		if s = strings.TrimSpace(s); s != "" {
			f.Statuses = append(f.Statuses, status.Status(s))
		}
	}
	var err error
	if p.From != "" {
		if f.ReceivedFrom, err = time.Parse(time.RFC3339, p.From); err != nil {
			return f, fmt.Errorf("from %q: want an RFC 3339 time such as 2026-01-02T15:04:05Z", p.From)
		}
	}
	if p.To != "" {
		if f.ReceivedTo, err = time.Parse(time.RFC3339, p.To); err != nil {
			return f, fmt.Errorf("to %q: want an RFC 3339 time such as 2026-01-02T15:04:05Z", p.To)
		}
	}
	if p.Since != "" {
		if p.From != "" {
			return f, fmt.Errorf("since and from: give one of them")
		}
		d, err := time.ParseDuration(p.Since)
		if err != nil || d <= 0 {
			return f, fmt.Errorf("since %q: want a positive duration such as 2h", p.Since)
		}
		f.ReceivedFrom = now.Add(-d)
	}
	if err := f.Validate(); err != nil {
		return f, err
	}
	return f, nil
}
