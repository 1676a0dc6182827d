# memgap's Ruby sampler, loaded with RUBYOPT=-r<this file> by `memgap run`.
# It records what Ruby knows of its memory (GC.stat, ObjectSpace) into
# $MEMGAP_RUBY_OUT (%p: the pid), one line per sample:
#   <monotonic ns> <kind> <key>=<value> ...
# It starts no thread (a program that joins every thread in Thread.list must
# not wait for ours): a finalizer that re-arms itself samples after garbage
# collections, at most every $MEMGAP_RUBY_INTERVAL_MS unless a major GC
# happened, and at_exit takes the last sample. Nothing here may raise into
# the program or print.
if ENV["MEMGAP_RUBY_OUT"].to_s != "" && !defined?(MemgapRubySampler)
  module MemgapRubySampler
    OUT = ENV["MEMGAP_RUBY_OUT"]
    INTERVAL_NS = (Integer(ENV.fetch("MEMGAP_RUBY_INTERVAL_MS", "200"), exception: false) || 200) * 1_000_000
    GC_KEYS = %i[count heap_allocated_pages heap_eden_pages heap_tomb_pages heap_available_slots
                 heap_live_slots heap_free_slots heap_final_slots malloc_increase_bytes
                 oldmalloc_increase_bytes minor_gc_count major_gc_count compact_count
                 total_allocated_pages total_freed_pages total_allocated_objects total_freed_objects].freeze
    COUNTED_TYPES = %i[T_OBJECT T_STRING T_ARRAY T_HASH T_DATA T_CLASS T_STRUCT T_IMEMO].freeze
    @last_ns = 0
    @last_major = -1

    class << self
      def now_ns
        Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
      end

      def write(line)
        File.open(OUT.sub("%p", Process.pid.to_s), File::WRONLY | File::APPEND | File::CREAT, 0o600) { |f| f.syswrite(line) }
      end

      def meta
        constants = defined?(GC::INTERNAL_CONSTANTS) ? GC::INTERNAL_CONSTANTS : {}
        fields = { rvalue_size: constants[:RVALUE_SIZE], heap_page_size: constants[:HEAP_PAGE_SIZE],
                   heap_page_obj_limit: constants[:HEAP_PAGE_OBJ_LIMIT] }
        line = +"#{now_ns} meta version=#{RUBY_VERSION}"
        fields.each { |k, v| line << " #{k}=#{v}" if v }
        write(line << "\n")
      end

      def sample(kind, deep)
        stat = GC.stat
        line = +"#{now_ns} #{kind}"
        GC_KEYS.each { |k| (v = stat[k]) && line << " #{k}=#{v}" }
        if deep
          line << " memsize_of_all=#{ObjectSpace.memsize_of_all}"
          counts = ObjectSpace.count_objects
          COUNTED_TYPES.each { |t| (v = counts[t]) && line << " #{t.to_s.downcase}=#{v}" }
        end
        write(line << "\n")
      end

      def exiting!
        @exiting = true
        sample("exit", true)
      end

      def after_gc
        return if @exiting
        now = now_ns
        major = GC.stat(:major_gc_count)
        return if major == @last_major && now - @last_ns < INTERVAL_NS
        kind = major == @last_major ? "sample" : "major_gc"
        @last_ns = now
        @last_major = major
        sample(kind, true)
      rescue Exception # rubocop:disable Lint/RescueException -- never into the program
        nil
      end

      # An object that dies in the next GC; its finalizer samples and arms the
      # next one. Not once the process exits: Ruby runs every finalizer then,
      # and one that arms another would never let it finish.
      def arm
        return if @exiting
        ObjectSpace.define_finalizer(Object.new, FINALIZER)
      rescue Exception # rubocop:disable Lint/RescueException
        nil
      end
    end

    FINALIZER = proc { |_| MemgapRubySampler.after_gc; MemgapRubySampler.arm }
  end

  begin
    require "objspace"
    MemgapRubySampler.meta
    MemgapRubySampler.sample("start", false)
    MemgapRubySampler.arm
    at_exit { (MemgapRubySampler.exiting! rescue nil) }
  rescue Exception # rubocop:disable Lint/RescueException
    nil
  end
end
