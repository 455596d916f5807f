// Indexing ops live with their gather helper in shape.cpp (index_select, gather).
