package inbox

import (
	"context"
	"fmt"
	"mime"
	"reflect"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/envelope"
)

// TypedEvent is an Event with its payload decoded into a T (Value).
type TypedEvent[T any] struct {
	Event
	Value T
}

// Router is a Handler that sends each event to the typed handler
// registered for its event type (Route), with the payload decoded by the
// router's codec. An event it cannot apply is dead-lettered at once
// (Permanent), without retries: one of a type no handler was registered
// for (the error wraps ErrUnknownEventType and names the type and the
// types the router knows), and one whose payload does not decode into the
// handler's Go type or has another content type than the codec's (the
// error names the event type, the Go type and the decoder's complaint,
// e.g. the field). Register every route before the consumer starts; a
// Router is then safe for concurrent use.
type Router struct {
	codec  envelope.Codec
	routes map[string]func(context.Context, pgx.Tx, Event) error
}

// NewRouter returns an empty Router decoding payloads with codec (nil:
// envelope.JSONCodec).
func NewRouter(codec envelope.Codec) *Router {
	if codec == nil {
		codec = envelope.JSONCodec{}
	}
	return &Router{codec: codec, routes: map[string]func(context.Context, pgx.Tx, Event) error{}}
}

// Route registers h for the events of eventType: their payloads are decoded
// into a T. It panics if eventType is empty or already has a handler (a
// programming error, like http.ServeMux's).
func Route[T any](r *Router, eventType string, h func(ctx context.Context, tx pgx.Tx, ev TypedEvent[T]) error) {
	if eventType == "" {
		panic("inbox: Route with an empty event type")
	}
	if _, ok := r.routes[eventType]; ok {
		panic(fmt.Sprintf("inbox: Route: event type %q already has a handler", eventType))
	}
	goType := reflect.TypeFor[T]().String()
	r.routes[eventType] = func(ctx context.Context, tx pgx.Tx, ev Event) error {
		if err := r.checkContentType(ev); err != nil {
			return err
		}
		te := TypedEvent[T]{Event: ev}
		if err := r.codec.Unmarshal(ev.Payload, &te.Value); err != nil {
			return Permanent(fmt.Errorf("decode the payload of event type %q into %s: %w", ev.EventType, goType, err))
		}
		return h(ctx, tx, te)
	}
}

// Handle applies ev with the handler registered for its type.
func (r *Router) Handle(ctx context.Context, tx pgx.Tx, ev Event) error {
	h, ok := r.routes[ev.EventType]
	if !ok {
		return Permanent(fmt.Errorf("%w %q (the router handles: %s)", ErrUnknownEventType, ev.EventType, strings.Join(r.EventTypes(), ", ")))
	}
	return h(ctx, tx, ev)
}

// EventTypes are the event types with a handler, sorted.
func (r *Router) EventTypes() []string {
	ts := make([]string, 0, len(r.routes))
	for t := range r.routes {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// checkContentType refuses an event whose content type is not the codec's
// (parameters such as charset aside).
func (r *Router) checkContentType(ev Event) error {
	got, want := ev.ContentType, r.codec.ContentType()
	if got == "" {
		got = envelope.ContentTypeJSON
	}
	if mediaType(got) != mediaType(want) {
		return Permanent(fmt.Errorf("event type %q has content type %q; the router's codec decodes %q", ev.EventType, got, want))
	}
	return nil
}

func mediaType(ct string) string {
	if mt, _, err := mime.ParseMediaType(ct); err == nil {
		return mt
	}
	return strings.ToLower(strings.TrimSpace(ct))
}
