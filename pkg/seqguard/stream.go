package seqguard

import (
	"cmp"
	"fmt"
)

// Stream identifies what the guard orders: what one producer wrote for one
// topic and source (I5). Two databases may use the same source names and
// one source may write to several topics; each (producer, topic, source) is
// ordered, parked and given up on its own.
//
// A record without a producer (written by a relay from before the producer
// header) belongs to its source's legacy stream, Stream{Source: s}: producer
// and topic empty, one stream per source across topics, as the guard
// tracked every source before streams.
type Stream struct {
	Producer string
	Topic    string
	Source   string
}

// StreamOf is the stream of an event of source read from topic with the
// given producer header ("" when the record has none: the legacy stream).
func StreamOf(producer, topic, source string) Stream {
	if producer == "" {
		return Stream{Source: source}
	}
	return Stream{Producer: producer, Topic: topic, Source: source}
}

// Legacy reports whether s is a legacy stream (no producer).
func (s Stream) Legacy() bool { return s.Producer == "" }

// String is "source" for a legacy stream, else "source (producer P, topic T)".
func (s Stream) String() string {
	if s.Legacy() {
		return fmt.Sprintf("%q", s.Source)
	}
	return fmt.Sprintf("%q (producer %s, topic %s)", s.Source, s.Producer, s.Topic)
}

// compareStreams is the order in which streams are locked: by source, then
// producer, then topic (a source's legacy stream first), as the seq_state
// primary key sorts.
func compareStreams(a, b Stream) int {
	if c := cmp.Compare(a.Source, b.Source); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Producer, b.Producer); c != 0 {
		return c
	}
	return cmp.Compare(a.Topic, b.Topic)
}
