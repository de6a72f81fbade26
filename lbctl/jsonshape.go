package lbctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// maxSafeInteger is the largest integer that every JSON reader (a float64, as in
// JavaScript or jq) holds exactly: 2^53.
const maxSafeInteger = 1 << 53

// numbersWhereSafe rewrites raw, m's proto JSON mapping, with its 64-bit integer fields as
// JSON numbers where their value is within ±2^53: the mapping writes them as strings so
// that no reader loses precision, which makes scripts compare counters as text. Larger
// values stay strings. The result is compact; protobuf readers accept both forms.
func numbersWhereSafe(raw []byte, md protoreflect.MessageDescriptor) ([]byte, error) {
	r := &numberRewriter{dec: json.NewDecoder(bytes.NewReader(raw))}
	r.dec.UseNumber()
	if err := r.value(jsonSlot{msg: md}); err != nil {
		return nil, fmt.Errorf("encode JSON: %w", err)
	}
	return r.out.Bytes(), nil
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

type numberRewriter struct {
	dec *json.Decoder
	out bytes.Buffer
}

func (r *numberRewriter) value(slot jsonSlot) error {
	tok, err := r.dec.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			return r.object(slot)
		case '[':
			elem := jsonSlot{}
			if slot.list != nil {
				elem = elementSlot(slot.list)
			}
			r.out.WriteByte('[')
			for i := 0; r.dec.More(); i++ {
				if i > 0 {
					r.out.WriteByte(',')
				}
				if err := r.value(elem); err != nil {
					return err
				}
			}
			_, err := r.dec.Token() // ]
			r.out.WriteByte(']')
			return err
		}
		return fmt.Errorf("unexpected %v", t)
	case string:
		if n, err := strconv.ParseInt(t, 10, 64); slot.int64 && err == nil && n >= -maxSafeInteger && n <= maxSafeInteger {
			r.out.WriteString(t)
			return nil
		}
		if n, err := strconv.ParseUint(t, 10, 64); slot.int64 && err == nil && n <= maxSafeInteger {
			r.out.WriteString(t)
			return nil
		}
		return r.writeString(t)
	case json.Number:
		r.out.WriteString(t.String())
	case bool:
		r.out.WriteString(strconv.FormatBool(t))
	case nil:
		r.out.WriteString("null")
	}
	return nil
}

func (r *numberRewriter) object(slot jsonSlot) error {
	r.out.WriteByte('{')
	for i := 0; r.dec.More(); i++ {
		tok, err := r.dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		if i > 0 {
			r.out.WriteByte(',')
		}
		if err := r.writeString(key); err != nil {
			return err
		}
		r.out.WriteByte(':')
		child := jsonSlot{}
		switch {
		case slot.mapValue != nil:
			child = elementSlot(slot.mapValue)
		case slot.msg != nil:
			if fd := slot.msg.Fields().ByJSONName(key); fd != nil {
				child = fieldSlot(fd)
			}
		}
		if err := r.value(child); err != nil {
			return err
		}
	}
	_, err := r.dec.Token() // }
	r.out.WriteByte('}')
	return err
}

// writeString writes s as a JSON string, without the HTML escaping of encoding/json's
// default (protojson writes <, > and & as they are).
func (r *numberRewriter) writeString(s string) error {
	enc := json.NewEncoder(&r.out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return err
	}
	r.out.Truncate(r.out.Len() - 1) // Encode's newline
	return nil
}
