package store

// SetDrained sets the node's drain flag.
func (s *Store) SetDrained(drained bool) error {
	t := s.begin()
	if t.drained == drained {
		t.abort()
		return nil
	}
	t.drained = drained
	t.events = append(t.events, Event{Type: Node})
	return t.commit()
}

// Drained reports the node's drain flag.
func (s *Store) Drained() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.drained
}
