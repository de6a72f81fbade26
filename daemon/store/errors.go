package store

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error is a store error that carries the gRPC code the API answers with. The API layer
// passes it through unchanged (grpc/status recognizes GRPCStatus).
type Error struct {
	Code codes.Code
	// Field names the offending request field, e.g. "service.backends[2].port"; empty when
	// the error is about the request as a whole.
	Field string
	Msg   string
	// retry marks a refusal that the same call may get past once the datapath has
	// applied earlier changes (IDs held for it); the store retries it (retryHeld).
	retry bool
}

func (e *Error) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

// GRPCStatus lets status.FromError and grpc servers return the right code.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Code, e.Error()) }

func invalid(field, format string, args ...any) *Error {
	return &Error{Code: codes.InvalidArgument, Field: field, Msg: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) *Error {
	return &Error{Code: codes.NotFound, Msg: fmt.Sprintf(format, args...)}
}

func alreadyExists(field, format string, args ...any) *Error {
	return &Error{Code: codes.AlreadyExists, Field: field, Msg: fmt.Sprintf(format, args...)}
}

func failedPrecondition(field, format string, args ...any) *Error {
	return &Error{Code: codes.FailedPrecondition, Field: field, Msg: fmt.Sprintf(format, args...)}
}

func unavailable(format string, args ...any) *Error {
	return &Error{Code: codes.Unavailable, Msg: fmt.Sprintf(format, args...)}
}

func aborted(format string, args ...any) *Error {
	return &Error{Code: codes.Aborted, Msg: fmt.Sprintf(format, args...)}
}

func resourceExhausted(format string, args ...any) *Error {
	return &Error{Code: codes.ResourceExhausted, Msg: fmt.Sprintf(format, args...)}
}

// Code returns the gRPC code of err: the store's own code, codes.Internal for anything
// else (a failed write of the state file, for instance).
func Code(err error) codes.Code {
	var se *Error
	if errors.As(err, &se) {
		return se.Code
	}
	return codes.Internal
}
