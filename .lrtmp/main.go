package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(os.Getenv("ONCEFLOW_TEST_KAFKA_BROKERS"), ",")...))
	if err != nil {
		panic(err)
	}
	adm := kadm.NewClient(cl)
	r, err := adm.CreateTopic(context.Background(), 2, 1, nil, os.Args[1])
	fmt.Println(r.Err, err)
	r, err = adm.CreateTopic(context.Background(), 1, 1, map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}, os.Args[2])
	fmt.Println(r.Err, err)
}
