package wire

// NewEncoderForTest is an Encoder without a registry (schema id 1 for every
// registered topic), for benchmarks of the encoding alone.
func NewEncoderForTest(formats map[string]TopicFormat) *Encoder {
	e := &Encoder{topics: map[string]*topicCodec{}}
	for topic, tf := range formats {
		if err := tf.Validate(); err != nil {
			panic(err)
		}
		tc := newTopicCodec(tf)
		tc.id = 1
		if tf.Format.Registered() {
			c, err := compile(tf.Format, tf.Schema, tf.Message)
			if err != nil {
				panic(err)
			}
			tc.codec = c
		}
		e.topics[topic] = tc
	}
	return e
}
