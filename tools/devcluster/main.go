// Command kube is a multi-call binary holding the Kubernetes control plane
// components and kubectl, so a local cluster needs one build and one binary.
//
// Invoke it through a symlink named after a component (kube-apiserver,
// kube-controller-manager, kube-scheduler, kubectl) or as
// "kube <component> [flags...]"; the component name may omit the "kube-"
// prefix ("kube apiserver ...").
package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	_ "time/tzdata" // CronJob time zones, as in the upstream mains

	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl auth plugins
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

// Each entry mirrors the main function of the upstream command.
var components = map[string]func() int{
	"kube-apiserver":          func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int { return cli.Run(controllermanager.NewControllerManagerCommand()) },
	"kube-scheduler":          func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kubectl":                 runKubectl,
}

func runKubectl() int {
	// kubectl reads its verbosity before flag parsing so that klog works
	// while it builds the command (plugins, .kuberc).
	logs.GlogSetter(kubectl.GetLogVerbosity(os.Args)) //nolint:errcheck
	if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
		kubectlutil.CheckErr(err) // prints the error and exits non-zero
	}
	return 0
}

func lookup(name string) (func() int, bool) {
	if run, ok := components[name]; ok {
		return run, true
	}
	run, ok := components["kube-"+name]
	return run, ok
}

func main() {
	if run, ok := lookup(filepath.Base(os.Args[0])); ok {
		os.Exit(run())
	}
	if len(os.Args) > 1 {
		if run, ok := lookup(os.Args[1]); ok {
			// The commands (and kubectl's plugin lookup) read os.Args
			// directly, so present them exactly as the standalone binary
			// would see them.
			os.Args = append([]string{os.Args[1]}, os.Args[2:]...)
			os.Exit(run())
		}
	}
	names := slices.Sorted(maps.Keys(components))
	fmt.Fprintf(os.Stderr, "usage: %s <%s> [flags...]\n", filepath.Base(os.Args[0]), strings.Join(names, "|"))
	os.Exit(2)
}
