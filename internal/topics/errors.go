package topics

import (
	"errors"
	"fmt"
	"strings"
)

// ErrDrift is matched (errors.Is) by every *DriftError.
var ErrDrift = errors.New("topics drift from the contract")

// DriftError lists every way the cluster's topics differ from the spec.
type DriftError struct {
	Drifts []Drift
}

func (e *DriftError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d topic drift(s) from the contract: ", len(e.Drifts))
	for i, d := range e.Drifts {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(d.String())
	}
	return b.String()
}

// Is makes errors.Is(err, ErrDrift) true.
func (e *DriftError) Is(target error) bool { return target == ErrDrift }
