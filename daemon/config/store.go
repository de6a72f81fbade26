package config

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
)

// Store types.
const (
	StoreFile = "file"
	StoreEtcd = "etcd"
)

// Store says where the desired state lives: the node's own state file (the default), or
// an etcd cluster that every LB node of a fleet shares.
type Store struct {
	// Type is "file" (state_dir/state.pb, this node's alone) or "etcd".
	Type string `json:"type"`
	// Endpoints are the etcd members' client URLs (http://host:2379, or https:// with
	// tls); required with etcd.
	Endpoints []string `json:"endpoints"`
	// Prefix of the fleet's keys in etcd; every node of one fleet uses the same.
	Prefix string `json:"prefix"`
	// NodeName is this node's name in the fleet (its registration); default: the host
	// name.
	NodeName string `json:"node_name"`
	// Timeout bounds each request to etcd: a write waits no longer for a quorum.
	Timeout Duration `json:"timeout"`
	TLS     StoreTLS `json:"tls"`
}

// StoreTLS is the client side of TLS to the etcd members.
type StoreTLS struct {
	// CAFile verifies the members' certificates; CertFile and KeyFile are this node's
	// client certificate (etcd's --client-cert-auth). All three, or none.
	CAFile   string `json:"ca_file"`
	CertFile string `json:"cert_file"`
	KeyFile  string `json:"key_file"`
}

// DefaultStorePrefix is the fleet's prefix when none is set.
const DefaultStorePrefix = "/lbd/"

func (s Store) validate() []error {
	var errs []error
	switch s.Type {
	case StoreFile:
		if len(s.Endpoints) > 0 {
			errs = append(errs, errors.New("store.endpoints: only the etcd store has endpoints (store.type is file)"))
		}
		return errs
	case StoreEtcd:
	default:
		return []error{fmt.Errorf("store.type: %q is not file or etcd", s.Type)}
	}
	if len(s.Endpoints) == 0 {
		errs = append(errs, errors.New("store.endpoints: the etcd store needs at least one member's client URL"))
	}
	tls := s.TLS.CAFile != "" || s.TLS.CertFile != "" || s.TLS.KeyFile != ""
	for i, e := range s.Endpoints {
		u, err := url.Parse(e)
		switch {
		case err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https"):
			errs = append(errs, fmt.Errorf("store.endpoints[%d]: %q is not an http:// or https:// URL with a host", i, e))
		case u.Scheme == "https" && !tls:
			errs = append(errs, fmt.Errorf("store.endpoints[%d]: %q is https but store.tls is not set", i, e))
		case u.Scheme == "http" && tls:
			errs = append(errs, fmt.Errorf("store.endpoints[%d]: %q is plain http while store.tls is set: use https://", i, e))
		}
	}
	if !strings.HasPrefix(s.Prefix, "/") || !strings.HasSuffix(s.Prefix, "/") || len(s.Prefix) < 2 {
		errs = append(errs, fmt.Errorf("store.prefix: %q must start and end with / (example: /lbd/edge-1/)", s.Prefix))
	}
	if strings.Contains(s.NodeName, "/") {
		errs = append(errs, fmt.Errorf("store.node_name: %q must not contain /", s.NodeName))
	}
	if s.Timeout < 0 {
		errs = append(errs, errors.New("store.timeout: must not be negative"))
	}
	if tls && (s.TLS.CAFile == "" || s.TLS.CertFile == "" || s.TLS.KeyFile == "") {
		errs = append(errs, errors.New("store.tls: give ca_file, cert_file and key_file together"))
	}
	for field, p := range map[string]string{"ca_file": s.TLS.CAFile, "cert_file": s.TLS.CertFile, "key_file": s.TLS.KeyFile} {
		if p != "" && !filepath.IsAbs(p) {
			errs = append(errs, fmt.Errorf("store.tls.%s: %q must be an absolute path", field, p))
		}
	}
	return errs
}
