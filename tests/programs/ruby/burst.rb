# Ruby-page fragmentation: a burst of small objects (each fits in its slot)
# all alive at once, then only every 100th kept: object pages stay with a
# few live slots each. With "compact", GC.compact moves the survivors together.
burst = Array.new(400_000) { |i| "k#{i}" }
survivors = burst.each_slice(100).map(&:first)
burst = nil
GC.start
GC.compact if ARGV[0] == "compact"
GC.start
puts "kept #{survivors.size}"
