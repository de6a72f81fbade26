package lbctl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
)

// The declarative commands: apply -f, diff -f and export work on services files
// (servicefile.go) through ApplyServices, whose validate_only mode answers what an
// apply would change: diff shows exactly what apply then does.

func (a *app) applyCommand() *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Make the services of each owner in a services file exactly those of the file",
		Long: `apply makes the services of each owner named in the file exactly the file's:
it creates the missing ones, updates the changed ones and deletes the owner's services
that the file does not list. Services of other owners are never touched. Each owner's
services change all or nothing; every owner of the file is checked before any is
changed. FILE is what 'lbctl export' writes; - reads standard input.`,
		Args: exactArgs(),
		RunE: a.run(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
			// Every document is checked first: a refused one changes nothing at all.
			docs, lb, _, err := a.plan(ctx, file)
			if err != nil {
				return err
			}
			var results []ownerResult
			for _, d := range docs {
				resp, err := lb.ApplyServices(ctx, &lbdv1.ApplyServicesRequest{Owner: d.Owner, Services: d.Services})
				if err != nil {
					if len(results) > 0 {
						a.printApplied(results, false)
						fmt.Fprintf(&a.out, "stopped at owner %q; the owners above were applied\n", d.Owner)
					}
					return ownerError(d.Owner, err)
				}
				results = append(results, ownerResult{d.Owner, resp})
			}
			return a.printResults(results, false)
		}),
	}
	cmd.Flags().StringVarP(&file, "filename", "f", "", "services file (what lbctl export writes); - for standard input")
	return cmd
}

func (a *app) diffCommand() *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "diff -f FILE",
		Short: "Show what 'lbctl apply -f FILE' would change, changing nothing",
		Long: `diff asks lbd what applying the services file would change and shows it, field
by field: "+ service" is created, "- service" deleted, "~ service" updated, with the
fields removed (-) and added (+). It changes nothing.`,
		Args: exactArgs(),
		RunE: a.run(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
			_, _, results, err := a.plan(ctx, file)
			if err != nil {
				return err
			}
			return a.printResults(results, true)
		}),
	}
	cmd.Flags().StringVarP(&file, "filename", "f", "", "services file (what lbctl export writes); - for standard input")
	return cmd
}

func (a *app) exportCommand() *cobra.Command {
	var owner string
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Write the services as a services file, which 'lbctl apply -f' accepts unchanged",
		Long: `export writes the services (of one owner with --owner; --owner "" for those
created one by one) as a services file: YAML, one document per owner. It is always
YAML: -o does not apply.`,
		Args: exactArgs(),
		RunE: a.run(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
			if a.opts.output != "table" {
				return usageErrorf("export always writes a services file (YAML); -o %s does not apply", a.opts.output)
			}
			lb, err := a.lb()
			if err != nil {
				return err
			}
			resp, err := lb.ListServices(ctx, &lbdv1.ListServicesRequest{Owner: owner})
			if err != nil {
				return err
			}
			svcs := resp.Services
			byOwner := cmd.Flags().Changed("owner")
			if byOwner && owner == "" {
				svcs = slices.DeleteFunc(svcs, func(s *lbdv1.Service) bool { return s.Owner != "" })
			}
			if len(svcs) == 0 {
				// An empty file for the owner asked (the unowned ones by default):
				// applying it removes what was created since.
				return writeOwnerDoc(&a.out, owner, nil)
			}
			return writeServicesFile(&a.out, svcs)
		}),
	}
	cmd.Flags().StringVar(&owner, "owner", "", `only the services of this owner ("" for those created one by one)`)
	return cmd
}

// plan reads the services file and asks lbd what applying each of its documents
// would change (validate_only), stopping at the first refused one.
func (a *app) plan(ctx context.Context, file string) ([]ownerServices, lbdv1.LoadBalancerServiceClient, []ownerResult, error) {
	docs, err := a.readFileFlag(file)
	if err != nil {
		return nil, nil, nil, err
	}
	lb, err := a.lb()
	if err != nil {
		return nil, nil, nil, err
	}
	var results []ownerResult
	for _, d := range docs {
		resp, err := lb.ApplyServices(ctx, &lbdv1.ApplyServicesRequest{Owner: d.Owner, Services: d.Services, ValidateOnly: true})
		if err != nil {
			return nil, nil, nil, ownerError(d.Owner, err)
		}
		results = append(results, ownerResult{d.Owner, resp})
	}
	return docs, lb, results, nil
}

// readFileFlag reads the services file that -f names.
func (a *app) readFileFlag(file string) ([]ownerServices, error) {
	switch file {
	case "":
		return nil, usageErrorf("-f FILE is required (- for standard input)")
	case "-":
		return readServicesFile("standard input", a.stdin)
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readServicesFile(file, f)
}

// ownerError names the owner whose services lbd refused, keeping the gRPC code.
func ownerError(owner string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("owner %q: %w", owner, err)
	}
	return status.Errorf(st.Code(), "owner %q: %s", owner, st.Message())
}

type ownerResult struct {
	owner string
	resp  *lbdv1.ApplyServicesResponse
}

// printResults prints what apply did or diff would do: the table view lists each owner
// and its changes, JSON and YAML the responses merged into one.
func (a *app) printResults(results []ownerResult, diff bool) error {
	if a.opts.output != "table" {
		merged := &lbdv1.ApplyServicesResponse{}
		for _, r := range results {
			merged.Created += r.resp.Created
			merged.Updated += r.resp.Updated
			merged.Deleted += r.resp.Deleted
			merged.Unchanged += r.resp.Unchanged
			merged.Changes = append(merged.Changes, r.resp.Changes...)
		}
		return a.print(merged, nil)
	}
	a.printApplied(results, diff)
	return nil
}

func (a *app) printApplied(results []ownerResult, diff bool) {
	w := &a.out
	for _, r := range results {
		if diff {
			fmt.Fprintf(w, "owner %q: %d to create, %d to update, %d to delete, %d unchanged\n",
				r.owner, r.resp.Created, r.resp.Updated, r.resp.Deleted, r.resp.Unchanged)
		} else {
			fmt.Fprintf(w, "owner %q applied: %d created, %d updated, %d deleted, %d unchanged\n",
				r.owner, r.resp.Created, r.resp.Updated, r.resp.Deleted, r.resp.Unchanged)
		}
		for _, c := range r.resp.Changes {
			printChange(w, c, diff)
		}
	}
}

// printChange writes one change: its mark and name, and with fields, the lines of the
// spec it removes (-) and adds (+).
func printChange(w io.Writer, c *lbdv1.ServiceChange, fields bool) {
	mark := map[lbdv1.ServiceChangeType]string{
		lbdv1.ServiceChangeType_SERVICE_CHANGE_TYPE_CREATED: "+",
		lbdv1.ServiceChangeType_SERVICE_CHANGE_TYPE_UPDATED: "~",
		lbdv1.ServiceChangeType_SERVICE_CHANGE_TYPE_DELETED: "-",
	}[c.Type]
	fmt.Fprintf(w, "%s service %s\n", mark, c.Name)
	if !fields {
		return
	}
	before, after := flatten(c.Before), flatten(c.After)
	for _, l := range mergeLines(before, after) {
		fmt.Fprintf(w, "    %s\n", l)
	}
}

// flatten writes a service's spec as "path: value" lines, backends by address and port
// so that a backend added or removed shows as itself, not as every later index shifting.
func flatten(svc *lbdv1.Service) map[string]string {
	out := map[string]string{}
	if svc == nil {
		return out
	}
	js, err := fileYAML.Marshal(fileSpec(svc))
	if err != nil {
		return out
	}
	var m map[string]any
	if json.Unmarshal(js, &m) != nil {
		return out
	}
	backends, _ := m["backends"].([]any)
	delete(m, "backends")
	flattenValue(out, "", m)
	for _, b := range backends {
		bm, _ := b.(map[string]any)
		key := fmt.Sprintf("backends[%v:%v]", bm["address"], portOf(bm))
		flattenValue(out, key, bm)
	}
	return out
}

func portOf(m map[string]any) any {
	if p, ok := m["port"]; ok {
		return p
	}
	return 0
}

func flattenValue(out map[string]string, path string, v any) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			p := k
			if path != "" {
				p = path + "." + k
			}
			flattenValue(out, p, e)
		}
	case []any:
		for i, e := range v {
			flattenValue(out, fmt.Sprintf("%s[%d]", path, i), e)
		}
	default:
		out[path] = fmt.Sprint(v)
	}
}

// mergeLines lists, by path, the lines only before holds (-) and only after holds (+).
func mergeLines(before, after map[string]string) []string {
	paths := map[string]bool{}
	for p := range before {
		paths[p] = true
	}
	for p := range after {
		paths[p] = true
	}
	sorted := make([]string, 0, len(paths))
	for p := range paths {
		sorted = append(sorted, p)
	}
	slices.Sort(sorted)
	var lines []string
	for _, p := range sorted {
		b, inB := before[p]
		n, inA := after[p]
		if inB && inA && b == n {
			continue
		}
		if inB {
			lines = append(lines, "- "+p+": "+b)
		}
		if inA {
			lines = append(lines, "+ "+p+": "+n)
		}
	}
	return lines
}
