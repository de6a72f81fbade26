package api

import (
	"context"
	"encoding/base64"
	"encoding/json"

	lbdv1 "github.com/lbd-dev/lbd/proto/lbd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// MaxPageSize is the most services one page of ListServices returns.
const MaxPageSize = 1000

// pageToken is where a list stopped, and for which request. Clients see it as an opaque
// string (AIP-158).
type pageToken struct {
	Owner string `json:"o"`
	After string `json:"a"`
}

func (p pageToken) encode() string {
	b, _ := json.Marshal(p) // a struct of strings always marshals
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodePageToken(s string) (pageToken, error) {
	var p pageToken
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &p)
	}
	if err != nil || p.After == "" {
		return p, status.Errorf(codes.InvalidArgument, "page_token: %q is not a token lbd returned as next_page_token", s)
	}
	return p, nil
}

// ListServices implements lbdv1.LoadBalancerServiceServer.
func (s *Server) ListServices(_ context.Context, r *lbdv1.ListServicesRequest) (*lbdv1.ListServicesResponse, error) {
	size := int(r.GetPageSize())
	switch {
	case size < 0:
		return nil, status.Errorf(codes.InvalidArgument, "page_size: %d is negative", size)
	case size == 0:
		size = -1 // every service
	case size > MaxPageSize:
		size = MaxPageSize
	}
	after := ""
	if r.GetPageToken() != "" {
		tok, err := decodePageToken(r.GetPageToken())
		if err != nil {
			return nil, err
		}
		if tok.Owner != r.GetOwner() {
			return nil, status.Errorf(codes.InvalidArgument, "page_token: it continues a list of owner %q, not %q", tok.Owner, r.GetOwner())
		}
		after = tok.After
	}
	svcs, more := s.st.ListServicesPage(r.GetOwner(), after, size)
	resp := &lbdv1.ListServicesResponse{Services: svcs}
	if more {
		resp.NextPageToken = pageToken{Owner: r.GetOwner(), After: svcs[len(svcs)-1].Name}.encode()
	}
	return resp, nil
}
