package outbox

import "fmt"

// CheckTopic reports whether name is a topic name Kafka accepts: 1 to 249
// ASCII letters, digits, '.', '_' and '-', and not "." or "..". Enqueue
// refuses other names (as does onceflow.enqueue); a row that has one anyway
// (written by hand) is set aside by the relay without asking Kafka.
func CheckTopic(name string) error {
	switch {
	case name == "":
		return &FieldError{Field: "topic", Reason: "is missing or empty"}
	case len(name) > 249:
		return &FieldError{Field: "topic", Reason: fmt.Sprintf("%d bytes is over Kafka's limit of 249", len(name))}
	case name == "." || name == "..":
		return &FieldError{Field: "topic", Reason: fmt.Sprintf("%q is not a legal Kafka topic name", name)}
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return &FieldError{Field: "topic", Reason: fmt.Sprintf("%q has %q at byte %d: Kafka allows only ASCII letters, digits, '.', '_' and '-'",
				truncate(name, 80), rune(c), i)}
		}
	}
	return nil
}

// truncate cuts s to at most n bytes, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
