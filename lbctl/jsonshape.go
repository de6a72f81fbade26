package lbctl

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// maxSafeInteger is the largest integer that every JSON reader (a float64, as in
// JavaScript or jq) holds exactly: 2^53.
const maxSafeInteger = 1 << 53

// shapeJSON rewrites raw, m's proto JSON mapping, in a fixed layout (on one line, or
// indented by two spaces as encoding/json's Indent does; protojson varies its spacing
// on purpose) and with its 64-bit integer fields as JSON numbers where their value is
// within ±2^53: the mapping writes them as strings so that no reader loses precision,
// which makes scripts compare counters as text. Larger values stay strings; protobuf
// readers accept both forms. It is one pass over the bytes, as cheap as the indenting
// alone: a listing of 10,000 services encodes every one of them.
func shapeJSON(raw []byte, md protoreflect.MessageDescriptor, multiline bool) ([]byte, error) {
	type frame struct {
		slot   jsonSlot
		object bool
	}
	out := make([]byte, 0, len(raw)+len(raw)/2)
	var stack []frame
	next := jsonSlot{msg: md} // the slot of the next value
	last := byte(0)           // the last structural byte written
	newline := func() {
		if multiline {
			out = append(out, '\n')
			for range stack {
				out = append(out, ' ', ' ')
			}
		}
	}
	for i := 0; i < len(raw); {
		c := raw[i]
		switch c {
		case ' ', '\n', '\t', '\r':
			i++
			continue
		case '{', '[':
			out = append(out, c)
			i++
			j := i
			for j < len(raw) && (raw[j] == ' ' || raw[j] == '\n' || raw[j] == '\t' || raw[j] == '\r') {
				j++
			}
			if j < len(raw) && (raw[j] == '}' || raw[j] == ']') {
				out = append(out, raw[j]) // empty: {} or []
				i, last = j+1, raw[j]
				continue
			}
			stack = append(stack, frame{slot: next, object: c == '{'})
			newline()
			if c == '[' {
				next = listElement(next)
			}
		case '}', ']':
			if len(stack) == 0 {
				return nil, fmt.Errorf("encode JSON: unbalanced %q", c)
			}
			stack = stack[:len(stack)-1]
			newline()
			out = append(out, c)
			i++
		case ',':
			out = append(out, ',')
			newline()
			i++
			if top := stack[len(stack)-1]; !top.object {
				next = listElement(top.slot)
			}
		case ':':
			out = append(out, ':')
			if multiline {
				out = append(out, ' ')
			}
			i++
		case '"':
			j := i + 1
			for j < len(raw) && raw[j] != '"' {
				if raw[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(raw) {
				return nil, errors.New("encode JSON: unterminated string")
			}
			j++
			str := raw[i:j]
			if len(stack) > 0 && stack[len(stack)-1].object && (last == '{' || last == ',') {
				next = objectMember(stack[len(stack)-1].slot, string(str[1:len(str)-1]))
				out = append(out, str...)
				last = '"'
				i = j
				continue
			}
			if next.int64 && safeInteger(str[1:len(str)-1]) {
				out = append(out, str[1:len(str)-1]...)
			} else {
				out = append(out, str...)
			}
			i = j
			last = 'v'
			continue
		default: // a number, true, false or null
			j := i
			for j < len(raw) && !strings.ContainsRune(",}] \n\t\r", rune(raw[j])) {
				j++
			}
			out = append(out, raw[i:j]...)
			i, last = j, 'v'
			continue
		}
		last = c
	}
	if len(stack) != 0 {
		return nil, errors.New("encode JSON: unbalanced brackets")
	}
	return out, nil
}

// safeInteger says whether b is an integer within ±2^53.
func safeInteger(b []byte) bool {
	if n, err := strconv.ParseInt(string(b), 10, 64); err == nil {
		return n >= -maxSafeInteger && n <= maxSafeInteger
	}
	return false // above 2^63 it is not safe either
}

// listElement is the slot of an element of a list in slot.
func listElement(slot jsonSlot) jsonSlot {
	if slot.list != nil {
		return elementSlot(slot.list)
	}
	return jsonSlot{}
}

// objectMember is the slot of the value under key in an object in slot.
func objectMember(slot jsonSlot, key string) jsonSlot {
	switch {
	case slot.mapValue != nil:
		return elementSlot(slot.mapValue)
	case slot.msg != nil:
		if fd := slot.msg.Fields().ByJSONName(key); fd != nil {
			return fieldSlot(fd)
		}
	}
	return jsonSlot{}
}

// jsonSlot says what a JSON value holds: a message (msg), a repeated field's list
// (list), a map field's object (mapValue: its values), or a 64-bit integer.
type jsonSlot struct {
	msg      protoreflect.MessageDescriptor
	list     protoreflect.FieldDescriptor
	mapValue protoreflect.FieldDescriptor
	int64    bool
}

// fieldSlot is the slot of field fd's value as written in its message.
func fieldSlot(fd protoreflect.FieldDescriptor) jsonSlot {
	switch {
	case fd.IsMap():
		return jsonSlot{mapValue: fd.MapValue()}
	case fd.IsList():
		return jsonSlot{list: fd}
	}
	return elementSlot(fd)
}

// elementSlot is the slot of one value of fd (one element of a list).
func elementSlot(fd protoreflect.FieldDescriptor) jsonSlot {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		// Well-known types have JSON forms of their own (a timestamp is a string).
		if strings.HasPrefix(string(fd.Message().FullName()), "google.protobuf.") {
			return jsonSlot{}
		}
		return jsonSlot{msg: fd.Message()}
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return jsonSlot{int64: true}
	}
	return jsonSlot{}
}
